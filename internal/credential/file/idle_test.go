package file_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/credential/oauth"
)

// TestIdleScopesParkNoGoroutines: a node builds, per sandbox, a file Backend, a Store and
// an oauth Manager over it; once their first reads are done and nothing is due, they park
// no goroutine of their own (the garbage collector scans every parked stack on each
// cycle), and once their context ends none is left.
func TestIdleScopesParkNoGoroutines(t *testing.T) {
	const scopes = 100
	path := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(path, []byte(`{"a": {"token": "one"}, "b": {"token": "two"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []func()
	for range scopes {
		b := file.New(path, file.Options{PollInterval: 10 * time.Millisecond})
		s := credential.NewStore(b, []string{"a", "b"}, credential.Options{Refresh: time.Minute})
		s.StartAsync(ctx)
		m := oauth.New(s, oauth.Options{Tick: 10 * time.Millisecond})
		m.StartAsync(ctx, s.FirstRead())
		<-s.FirstRead()
		waits = append(waits, s.Wait, m.Wait)
	}
	// The node's one poller, and a look at the file it may be handing out, may run.
	idle := func() bool { return runtime.NumGoroutine()-base <= scopes/10 }
	eventually(t, "idle scopes parking at most one goroutine per ten", idle)
	cancel()
	var wg sync.WaitGroup
	for _, wait := range waits {
		wg.Go(wait)
	}
	wg.Wait()
	eventually(t, "no goroutine left after the scopes ended", func() bool { return runtime.NumGoroutine() <= base })
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d goroutines after 5s", what, runtime.NumGoroutine())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
