package file_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// Scenarios: a Store over a real credentials file in a temporary directory, the way egressd
// runs it. Secrets are planted; no error, status or log line may contain one.

const (
	planted = "PLANTED-s3cr3t-v4lue"
	poll    = 20 * time.Millisecond
)

// world is a credentials file, a file backend watching it and a Store over it.
type world struct {
	t     *testing.T
	path  string
	store *credential.Store
	log   *syncBuffer
	clock *clock // nil: the real clock
}

// newWorld writes secrets (ID -> secret shape; nil: no file) and starts a Store managing
// ids. With fake set, the Store's clock is manual; MaxStale is maxStale (0: an hour).
func newWorld(t *testing.T, secrets map[string]any, ids []string, maxStale time.Duration, fake bool) *world {
	w := &world{t: t, path: filepath.Join(t.TempDir(), "credentials.json"), log: &syncBuffer{}}
	if secrets != nil {
		w.write(secrets)
	}
	if maxStale == 0 {
		maxStale = time.Hour
	}
	log := zerolog.New(w.log)
	o := credential.Options{MaxStale: maxStale, Log: log}
	if fake {
		w.clock = &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		o.Now = w.clock.Now
	}
	w.store = credential.NewStore(file.New(w.path, file.Options{PollInterval: poll, Log: log}), ids, o)
	ctx, cancel := context.WithCancel(context.Background())
	w.store.Start(ctx)
	t.Cleanup(func() {
		cancel()
		w.store.Wait()
		if out := w.log.String(); strings.Contains(out, planted) {
			t.Errorf("the log shows a secret:\n%s", out)
		}
	})
	return w
}

func (w *world) write(secrets map[string]any) {
	w.t.Helper()
	b, err := json.Marshal(secrets)
	if err != nil {
		w.t.Fatal(err)
	}
	w.writeRaw(string(b))
}

func (w *world) writeRaw(content string) {
	w.t.Helper()
	tmp := w.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Rename(tmp, w.path); err != nil {
		w.t.Fatal(err)
	}
}

func token(tok string) map[string]any { return map[string]any{"token": tok} }

// get returns the Authorization value of id and its version, failing on an error.
func (w *world) get(id string) (string, string) {
	w.t.Helper()
	v, err := w.store.Get(id)
	if err != nil {
		w.t.Fatalf("Get(%s): %v", id, err)
	}
	return v.Headers[0].Value, v.Version
}

// cause returns the cause of Get(id)'s *UnavailableError, or "" when it is servable.
func (w *world) cause(id string) string {
	w.t.Helper()
	_, err := w.store.Get(id)
	if err == nil {
		return ""
	}
	var ue *credential.UnavailableError
	if !errors.As(err, &ue) || !errors.Is(err, credential.ErrUnavailable) {
		w.t.Fatalf("Get(%s): not an *UnavailableError: %v", id, err)
	}
	if strings.Contains(err.Error(), planted) {
		w.t.Fatalf("Get(%s): error shows a secret: %v", id, err)
	}
	return ue.Cause
}

// eventually polls cond for up to limit.
func (w *world) eventually(limit time.Duration, what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("not within %v: %s; status %+v", limit, what, w.store.Status())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (w *world) status(id string) credential.Status {
	st := w.store.Status()[id]
	if b, _ := json.Marshal(st); bytes.Contains(b, []byte(planted)) {
		w.t.Fatalf("status shows a secret: %s", b)
	}
	return st
}

func TestFileStoreInitialRead(t *testing.T) {
	w := newWorld(t, map[string]any{
		"api":   token("tok-" + planted),
		"keyed": map[string]any{"headers": map[string]any{"x-api-key": planted, "x-org": "o1"}},
	}, []string{"api", "keyed", "ghost"}, 0, false)

	if got, version := w.get("api"); got != "Bearer tok-"+planted || len(version) != len("hmac:")+16 {
		t.Errorf("api: version %q", version)
	}
	if v, _ := w.store.Get("keyed"); strings.Join(v.Names(), ",") != "X-Api-Key,X-Org" {
		t.Errorf("keyed: %v", v)
	}
	if c := w.cause("ghost"); c != credential.CauseNotFound {
		t.Errorf("ghost: cause %q", c)
	}
	if st := w.status("ghost"); st.Ready || !strings.HasPrefix(st.Error, "not_found: credential not found in credentials file ") {
		t.Errorf("ghost status %+v", st)
	}
	if st := w.status("api"); !st.Ready || st.Error != "" {
		t.Errorf("api status %+v", st)
	}
	if w.store.Ready() {
		t.Error("Ready with ghost absent")
	}
}

func TestFileStoreRotation(t *testing.T) {
	w := newWorld(t, map[string]any{"api": token("one-" + planted)}, []string{"api"}, 0, false)
	_, v1 := w.get("api")
	time.Sleep(2 * poll) // the watcher's first poll has run

	w.write(map[string]any{"api": token("two-" + planted)})
	start := time.Now()
	w.eventually(poll+500*time.Millisecond, "the new token is served", func() bool {
		got, _ := w.get("api")
		return got == "Bearer two-"+planted
	})
	t.Logf("rotation seen after %v", time.Since(start))
	_, v2 := w.get("api")
	if v2 == v1 {
		t.Errorf("version %s did not change", v2)
	}
	var line map[string]string
	for _, l := range strings.Split(w.log.String(), "\n") {
		if strings.Contains(l, `"credential rotated"`) {
			json.Unmarshal([]byte(l), &line)
		}
	}
	want := map[string]string{"level": "info", "credential": "api", "version": v2, "previous_version": v1,
		"backend": "file", "message": "credential rotated"}
	if len(line) != len(want) {
		t.Fatalf("rotation line %v, want %v", line, want)
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("rotation line %s = %q, want %q", k, line[k], v)
		}
	}
}

// A deleted or corrupt file is a failed read: the last good value is served until MaxStale
// (fake clock, exact bounds), then the credential is stale; a fixed file serves again.
func TestFileStoreFailedReadServesUntilMaxStale(t *testing.T) {
	const maxStale = 300 * time.Millisecond
	for name, breakIt := range map[string]func(w *world){
		"deleted":      func(w *world) { os.Remove(w.path) },
		"corrupt JSON": func(w *world) { w.writeRaw(`{"api": {"token": "` + planted + `"}`) },
		"not object":   func(w *world) { w.writeRaw(`["` + planted + `"]`) },
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, map[string]any{"api": token(planted)}, []string{"api"}, maxStale, true)
			breakIt(w)
			w.eventually(time.Second, "the failed read is noticed", func() bool {
				return strings.HasPrefix(w.status("api").Error, "refresh_failed: ")
			})
			t.Logf("status %+v", w.status("api"))
			w.clock.Advance(maxStale)
			if got, _ := w.get("api"); got != "Bearer "+planted || !w.store.Ready() {
				t.Error("last good value not served at MaxStale")
			}
			w.clock.Advance(time.Millisecond)
			if c := w.cause("api"); c != credential.CauseStale {
				t.Fatalf("past MaxStale: cause %q", c)
			}
			if st := w.status("api"); st.Ready || !strings.HasPrefix(st.Error, "stale: ") || w.store.Ready() {
				t.Errorf("status past MaxStale %+v", st)
			}

			w.write(map[string]any{"api": token("fixed-" + planted)})
			w.eventually(time.Second, "the fixed file serves again", func() bool { return w.cause("api") == "" })
			if got, _ := w.get("api"); got != "Bearer fixed-"+planted || !w.store.Ready() {
				t.Error("not the fixed value")
			}
		})
	}
}

// The same with the real clock: MaxStale 300ms, background refreshes every 100ms.
func TestFileStoreDeletedRealClock(t *testing.T) {
	w := newWorld(t, map[string]any{"api": token(planted)}, []string{"api"}, 300*time.Millisecond, false)
	os.Remove(w.path)
	deleted := time.Now()
	if got, _ := w.get("api"); got != "Bearer "+planted {
		t.Error("not served right after the deletion")
	}
	w.eventually(2*time.Second, "stale", func() bool { return w.cause("api") == credential.CauseStale })
	t.Logf("stale %v after the deletion, status %+v", time.Since(deleted), w.status("api"))

	w.write(map[string]any{"api": token("back-" + planted)})
	w.eventually(time.Second, "available again", func() bool { return w.cause("api") == "" })
}

// An ID removed from a file that still parses is unavailable at once, not after MaxStale;
// the other IDs keep being served.
func TestFileStoreIDRemoved(t *testing.T) {
	w := newWorld(t, map[string]any{"api": token(planted), "other": token("o-" + planted)},
		[]string{"api", "other"}, 0, true)
	w.write(map[string]any{"other": token("o-" + planted)})
	w.eventually(time.Second, "api unavailable", func() bool { return w.cause("api") == credential.CauseNotFound })
	if w.cause("other") != "" || w.status("other").Error != "" {
		t.Errorf("other: %+v", w.status("other"))
	}
	if st := w.status("api"); st.Ready || !strings.HasPrefix(st.Error, "not_found: ") || w.store.Ready() {
		t.Errorf("api status %+v", st)
	}
	w.write(map[string]any{"api": token(planted), "other": token("o-" + planted)})
	w.eventually(time.Second, "api back", func() bool { return w.cause("api") == "" })
	if !w.store.Ready() {
		t.Error("not Ready")
	}
}

// A bad shape makes that ID unavailable at once; the others are unaffected.
func TestFileStoreInvalidShape(t *testing.T) {
	w := newWorld(t, map[string]any{"api": token(planted), "other": token("o")}, []string{"api", "other"}, 0, true)
	w.write(map[string]any{"api": map[string]any{"token": planted, "headers": map[string]any{"X-A": planted}}, "other": token("o")})
	w.eventually(time.Second, "api invalid", func() bool { return w.cause("api") == credential.CauseInvalid })
	if st := w.status("api"); !strings.Contains(st.Error, `both "token" and "headers"`) {
		t.Errorf("api status %+v", st)
	}
	if w.cause("other") != "" {
		t.Error("other unavailable")
	}
}

// No file at start: never read; the file appears: served without a restart.
func TestFileStoreFileAppears(t *testing.T) {
	w := newWorld(t, nil, []string{"api"}, 0, false)
	if c := w.cause("api"); c != credential.CauseNeverRead {
		t.Errorf("cause %q", c)
	}
	if st := w.status("api"); st.Ready || !strings.HasPrefix(st.Error, "never_read: stat ") {
		t.Errorf("status %+v", st)
	}
	w.write(map[string]any{"api": token(planted)})
	w.eventually(time.Second, "available", func() bool { return w.cause("api") == "" })
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type syncBuffer = syncbuf.Buffer
