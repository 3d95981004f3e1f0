package file

import (
	"context"
	"sync"
	"time"
)

// A file is polled once however many Backends watch it: one poller per path and
// interval looks at the file as load does (its stat every interval; its content when
// the stat changed, while the last read was racy, and every hashEvery-th poll) and,
// when the content or its failure changed, wakes every Backend watching it, which
// then reads the file into its own snapshot on a goroutine that lives only while it
// does: a Backend waiting for a change parks none. A node whose sandboxes name one
// credentials file stats it once an interval, not once per sandbox. The poller keeps
// no secret: its probe keeps the file's stat and hash, never the parsed content.

// pollKey names a poller.
type pollKey struct {
	path  string
	every time.Duration
}

// poller polls one file for the Backends watching it.
type poller struct {
	probe *Backend // loads without parsing
	stop  context.CancelFunc

	mu   sync.Mutex
	subs map[*pollSub]struct{}
}

// pollSub is one Watch waiting on a poller; its fields are guarded by poller.mu.
type pollSub struct {
	look    func(force bool) // the Backend's look at the file; force: re-read whatever its stat says
	due     bool             // a look is wanted: one pending is not asked for twice
	force   bool             // the poller saw a change since the last look began
	running bool             // a goroutine is looking (drain)
	fresh   bool             // not polled for yet: Watch's first poll always looks
}

var pollers = struct {
	mu sync.Mutex
	m  map[pollKey]*poller
}{m: map[pollKey]*poller{}}

// join adds a watcher of k's file, starting its poller if none runs, and returns the
// function that removes it (stopping the poller after the last). look is called, never
// twice at once, after each poll that wakes the watcher.
func join(k pollKey, look func(force bool)) func() {
	s := &pollSub{look: look, fresh: true}
	pollers.mu.Lock()
	defer pollers.mu.Unlock()
	p := pollers.m[k]
	if p == nil {
		ctx, cancel := context.WithCancel(context.Background())
		p = &poller{probe: &Backend{path: k.path, o: Options{PollInterval: k.every}, probe: true}, stop: cancel, subs: map[*pollSub]struct{}{}}
		pollers.m[k] = p
		go p.run(ctx, k.every)
	}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return func() {
		pollers.mu.Lock()
		defer pollers.mu.Unlock()
		p.mu.Lock()
		delete(p.subs, s)
		s.due = false
		last := len(p.subs) == 0
		p.mu.Unlock()
		if last {
			p.stop()
			delete(pollers.m, k)
		}
	}
}

// run polls until ctx ends.
func (p *poller) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var seen uint64
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		snap := p.probe.load(n%hashEvery == 0)
		p.tell(snap.gen != seen)
		seen = snap.gen
	}
}

// tell wakes every watcher when the file changed, else those not polled for yet.
func (p *poller) tell(changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if !changed && !s.fresh {
			continue
		}
		s.fresh, s.due = false, true
		s.force = s.force || changed
		if !s.running {
			s.running = true
			go p.drain(s)
		}
	}
}

// drain looks at the file for s until no look is due, then ends.
func (p *poller) drain(s *pollSub) {
	for {
		p.mu.Lock()
		if !s.due {
			s.running = false
			p.mu.Unlock()
			return
		}
		force := s.force
		s.due, s.force = false, false
		p.mu.Unlock()
		s.look(force)
	}
}
