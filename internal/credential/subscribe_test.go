package credential

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSubscribeToldAfterEveryRead: a subscriber hears of every read, after Get serves its
// outcome, so it can tell at once that a credential was revoked or removed, and also that
// one went stale, which no change of value marks. A read cut short by shutdown is no
// outcome and is not told.
func TestSubscribeToldAfterEveryRead(t *testing.T) {
	f, clock := newFake(), newClock()
	f.setToken("a", "tok-a")
	f.setToken("b", "tok-b")
	s := startStore(t, f, []string{"a", "b"}, Options{MaxStale: time.Minute, Refresh: time.Hour, Now: clock.Now})
	var mu sync.Mutex
	var told []string
	s.Subscribe(func(id string) {
		_, err := s.Get(id) // what the subscriber sees is the read's outcome
		mu.Lock()
		defer mu.Unlock()
		told = append(told, fmt.Sprintf("%s:%v", id, err == nil))
	})
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(told) == 0 {
			return ""
		}
		return told[len(told)-1]
	}
	ctx := context.Background()

	f.fail("a", fmt.Errorf("credential a: %w", ErrRevoked))
	s.RefreshNow(ctx, "a")
	if got := last(); got != "a:false" {
		t.Errorf("after a revoking read: told %q, want a:false", got)
	}
	f.fail("a", nil)
	f.remove("b")
	s.RefreshNow(ctx, "b")
	if got := last(); got != "b:false" {
		t.Errorf("after a not_found read: told %q, want b:false", got)
	}
	s.RefreshNow(ctx, "a")
	if got := last(); got != "a:true" {
		t.Errorf("after a recovering read: told %q, want a:true", got)
	}
	f.fail("a", errBackendDown)
	clock.Advance(2 * time.Minute)
	s.RefreshNow(ctx, "a")
	if got := last(); got != "a:false" {
		t.Errorf("after a failed read past MaxStale: told %q, want a:false", got)
	}

	mu.Lock()
	n := len(told)
	mu.Unlock()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	s.RefreshNow(cancelled, "a")
	mu.Lock()
	defer mu.Unlock()
	if len(told) != n {
		t.Errorf("a read cut short by shutdown was told: %v", told[n:])
	}
}
