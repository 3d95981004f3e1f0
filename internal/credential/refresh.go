package credential

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Start reads every ID once, synchronously (the whole pass bounded by ReadTimeout: a read
// still running then is a failed read), then refreshes each ID in the background every
// Refresh ± Jitter until ctx ends. If the backend is a Watcher, Start also calls its Watch,
// re-reading every ID on each change; if it is an IDWatcher, its WatchIDs, re-reading the
// IDs it names. Reads after the first are never on the request path.
// Start (or StartAsync) must be called once.
func (s *Store) Start(ctx context.Context) {
	s.StartAsync(ctx)
	select {
	case <-s.first:
	case <-ctx.Done():
	}
}

// StartAsync is Start without the wait: the first reads run in the background, each ID's
// Status is pending until its own is done, FirstRead is closed once all are, and
// AwaitFirst waits for one.
func (s *Store) StartAsync(ctx context.Context) {
	if !s.started.CompareAndSwap(false, true) {
		panic("credential: Store.Start called twice")
	}
	s.tasks.Bind(ctx)
	started := s.tasks.Go(func() {
		first, cancel := context.WithTimeout(ctx, s.o.ReadTimeout)
		s.refreshAll(first)
		cancel()
		s.firstDone()
		s.startLoops(ctx)
	})
	if !started { // ctx had ended: no read will come
		s.firstDone()
	}
}

// firstDone marks every ID's first read done, a read cut short by the timeout too.
func (s *Store) firstDone() {
	for _, id := range s.ids {
		s.entries[id].firstDone()
	}
	close(s.first)
}

// startLoops schedules the refresh of every ID and starts the backend's watchers. Only
// WatchIDs keeps a goroutine: a timer or a Watch callback starts one per read.
func (s *Store) startLoops(ctx context.Context) {
	for _, id := range s.ids {
		s.schedule(ctx, s.entries[id])
	}
	context.AfterFunc(ctx, s.stopTimers)
	if w, ok := s.backend.(Watcher); ok {
		w.Watch(ctx, func() { s.tasks.Do(func() { s.RefreshNow(ctx, "") }) })
	}
	if w, ok := s.backend.(IDWatcher); ok {
		s.tasks.Go(func() { w.WatchIDs(ctx, func(id string) { s.RefreshNow(ctx, id) }) })
	}
}

// schedule arms e's next refresh, a jittered Refresh from now, unless ctx has ended. The
// timer's goroutine exists only while it fires: it starts the read, which arms the next.
func (s *Store) schedule(ctx context.Context, e *entry) {
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	e.timer = time.AfterFunc(s.interval(), func() {
		s.tasks.Go(func() {
			s.refresh(ctx, e)
			s.schedule(ctx, e)
		})
	})
}

// stopTimers disarms every refresh once Start's ctx has ended: schedule arms none after.
func (s *Store) stopTimers() {
	s.timerMu.Lock()
	defer s.timerMu.Unlock()
	for _, e := range s.entries {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
}

// Wait blocks until the goroutines Start began have returned; they do once its ctx ends.
func (s *Store) Wait() { s.tasks.Wait() }

// RefreshNow re-reads one ID now, or every ID when id is ""; it returns when the reads are
// done. IDs the Store does not manage are ignored. The file backend's watcher calls it on
// every change, the vault backend's when a lease nears its end or after a new login.
func (s *Store) RefreshNow(ctx context.Context, id string) {
	if id == "" {
		s.refreshAll(ctx)
		return
	}
	if e := s.entries[id]; e != nil {
		s.refresh(ctx, e)
	}
}

func (s *Store) interval() time.Duration { return jittered(s.o.Refresh, s.o.Jitter, rand.Float64()) }

// jittered spreads base over [base*(1-frac), base*(1+frac)) as r goes over [0, 1).
func jittered(base time.Duration, frac, r float64) time.Duration {
	return base + time.Duration(float64(base)*frac*(2*r-1))
}

// refreshAll reads every ID, at most readParallelism at a time, and returns when all are done.
func (s *Store) refreshAll(ctx context.Context) {
	sem := make(chan struct{}, readParallelism)
	var wg sync.WaitGroup
	for _, id := range s.ids {
		e := s.entries[id]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.refresh(ctx, e)
		})
	}
	wg.Wait()
}

// refresh reads one ID, stores the outcome and then tells the subscribers (Subscribe), once
// the read's lock is released.
func (s *Store) refresh(ctx context.Context, e *entry) {
	if s.read(ctx, e) {
		s.notify(e.id)
	}
}

// read reads one ID and stores the outcome: a good read replaces the value, a failed one
// keeps it (Get decides staleness), not_found, invalid and revoked make it unavailable at
// once. It reports whether it stored an outcome.
func (s *Store) read(ctx context.Context, e *entry) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := s.o.Now()
	rctx, cancel := context.WithTimeout(ctx, s.o.ReadTimeout)
	sec, version, err := s.backend.Read(rctx, e.id)
	cancel()
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return false // shutting down (or the caller gave up): not the backend's failure
	}
	if err == nil && sec.empty() {
		err = fmt.Errorf("credential %s: backend %s returned an empty secret: %w", e.id, s.backend.Name(), ErrInvalid)
	}
	prev := e.cur.Load()
	next := &state{good: prev.good, hasGood: prev.hasGood, result: classify(err), err: err}
	if err == nil {
		next.good = Value{ID: e.id, Version: version, Type: sec.Type, Headers: slices.Clone(sec.Headers),
			OAuth2: sec.OAuth2, Env: sec.Env, GitHubApp: sec.GitHubApp, AWS: sec.AWS, ReadAt: start}
		next.hasGood = true
	}
	e.cur.Store(next)
	e.firstDone()
	s.report(e.id, prev, next)
	return true
}

// Subscribe has fn called with an ID after every read of it, once Get serves the read's
// outcome: a rotation, a recovery, and every way the ID becomes unavailable (revoked,
// not_found, invalid, or a failed read past MaxStale, which no value change marks). The
// proxy re-decides the open connections that carry the ID (proxy.Server.CredentialChanged).
// fn runs on a refresh goroutine, after the read's lock is released: it must return
// quickly and may call Get.
func (s *Store) Subscribe(fn func(id string)) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	s.subs = append(s.subs, fn)
}

func (s *Store) notify(id string) {
	s.subMu.Lock()
	subs := s.subs
	s.subMu.Unlock()
	for _, fn := range subs {
		fn(id)
	}
}

func classify(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, ErrNotFound):
		return ResultNotFound
	case errors.Is(err, ErrRevoked):
		return ResultRevoked
	case errors.Is(err, ErrInvalid):
		return ResultInvalid
	}
	return ResultError
}

// report logs and counts one read. Lines carry the ID, versions and errors, never values.
func (s *Store) report(id string, prev, next *state) {
	if m := s.o.Metrics; m != nil {
		if m.Refresh != nil {
			m.Refresh(id, next.result)
		}
		if m.Age != nil && next.hasGood {
			m.Age(id, s.o.Now().Sub(next.good.ReadAt).Seconds())
		}
	}
	log, backend := &s.o.Log, s.backend.Name()
	switch {
	case next.result != ResultOK:
		log.Warn().Str("credential", id).Str("backend", backend).Str("result", next.result).
			Err(next.err).Msg("credential read failed")
	case !prev.hasGood:
		log.Info().Str("credential", id).Str("version", next.good.Version).Str("backend", backend).
			Msg("credential loaded")
	case prev.good.Version != next.good.Version:
		log.Info().Str("credential", id).Str("version", next.good.Version).
			Str("previous_version", prev.good.Version).Str("backend", backend).Msg("credential rotated")
	case prev.result != ResultOK:
		log.Info().Str("credential", id).Str("version", next.good.Version).Str("backend", backend).
			Str("previous_result", prev.result).Msg("credential recovered")
	}
}
