package credential

import (
	"context"
	"testing"
	"time"
)

// idWatchingBackend is a fakeBackend that is also an IDWatcher: the test sends the IDs to
// refresh on ids, and learns on done when each refresh has returned.
type idWatchingBackend struct {
	*fakeBackend
	ids  chan string
	done chan string
}

func (b *idWatchingBackend) WatchIDs(ctx context.Context, refresh func(id string)) {
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-b.ids:
			refresh(id)
			b.done <- id
		}
	}
}

func TestIDWatcherRefreshesTheIDsItNames(t *testing.T) {
	f := newFake()
	f.setToken("a", "tok-a")
	f.setToken("b", "tok-b")
	b := &idWatchingBackend{fakeBackend: f, ids: make(chan string), done: make(chan string)}
	s := startStore(t, b, []string{"a", "b"}, Options{})
	refresh := func(id string) {
		t.Helper()
		b.ids <- id
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("refresh(%q) did not return", id)
		}
	}
	reads := func() (int, int) { return len(f.readTimes("a")), len(f.readTimes("b")) }
	if a, bb := reads(); a != 1 || bb != 1 {
		t.Fatalf("after Start: %d and %d reads, want 1 each", a, bb)
	}

	f.setToken("b", "tok-b2")
	refresh("b") // returns once the read is done: the new version is served at once
	if a, bb := reads(); a != 1 || bb != 2 {
		t.Errorf("refresh(b): %d and %d reads, want 1 and 2", a, bb)
	}
	if v, err := s.Get("b"); err != nil || v.Version != "v2" {
		t.Errorf("after refresh(b): %v, %v; want version v2", v, err)
	}

	refresh("") // every ID
	if a, bb := reads(); a != 2 || bb != 3 {
		t.Errorf(`refresh(""): %d and %d reads, want 2 and 3`, a, bb)
	}
	refresh("not-managed") // ignored
	if a, bb := reads(); a != 2 || bb != 3 {
		t.Errorf("refresh of an unmanaged ID read something: %d and %d reads", a, bb)
	}
}
