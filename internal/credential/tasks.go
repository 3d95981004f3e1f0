package credential

import (
	"context"
	"sync"
)

// Tasks tracks the goroutines of work bound to one context, started on demand (a timer
// that fired, a watcher's callback, a wake-up) rather than parked in advance: an idle
// scope runs none. Go refuses once the context has ended, under the same lock Wait takes
// first, so a Wait called after the context ended never races an Add of its WaitGroup.
type Tasks struct {
	ctx context.Context
	mu  sync.Mutex
	wg  sync.WaitGroup
}

// Bind sets the context the tasks end with, before the first Go; a later Bind replaces it
// (a Manager runs under Background until it is started).
func (t *Tasks) Bind(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ctx = ctx
}

// Go runs f on a new goroutine unless the bound context has ended; it reports whether it did.
func (t *Tasks) Go(f func()) bool {
	if !t.begin() {
		return false
	}
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

// Do runs f on the caller's goroutine, counted by Wait, unless the bound context has ended;
// it reports whether it did.
func (t *Tasks) Do(f func()) bool {
	if !t.begin() {
		return false
	}
	defer t.wg.Done()
	f()
	return true
}

// begin adds one task unless the bound context has ended.
func (t *Tasks) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil || t.ctx.Err() != nil {
		return false
	}
	t.wg.Add(1)
	return true
}

// Wait blocks until every goroutine Go started has returned. Called after the bound
// context has ended, it returns once the last one has and none can start again.
func (t *Tasks) Wait() {
	t.mu.Lock()
	//lint:ignore SA2001 the empty critical section orders Wait after every Go that saw a live context
	t.mu.Unlock()
	t.wg.Wait()
}
