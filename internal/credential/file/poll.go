package file

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A file is polled once however many Backends watch it: one poller per path and
// interval looks at the file as load does (its stat every interval; its content when
// the stat changed, while the last read was racy, and every hashEvery-th poll) and,
// when the content or its failure changed, wakes every Backend watching it, which
// then reads the file into its own snapshot. A node whose sandboxes name one
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

// pollSub is one Watch waiting on a poller.
type pollSub struct {
	wake  chan struct{} // buffered: a wake-up pending is not sent twice
	force atomic.Bool   // the poller saw a change: the Backend re-reads whatever its stat says
	fresh bool          // not polled for yet (poller.mu): Watch's first poll always looks
}

var pollers = struct {
	mu sync.Mutex
	m  map[pollKey]*poller
}{m: map[pollKey]*poller{}}

// join adds a watcher of k's file, starting its poller if none runs, and returns the
// function that removes it (stopping the poller after the last).
func join(k pollKey) (*pollSub, func()) {
	s := &pollSub{wake: make(chan struct{}, 1), fresh: true}
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
	return s, func() {
		pollers.mu.Lock()
		defer pollers.mu.Unlock()
		p.mu.Lock()
		delete(p.subs, s)
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
		s.fresh = false
		if changed {
			s.force.Store(true)
		}
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}
