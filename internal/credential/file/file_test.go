package file

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
)

// planted is a secret value: no error or log line may contain it.
const planted = "PLANTED-s3cr3t-v4lue"

// writeFile replaces path atomically (write a temporary file, rename it over), mode 0600.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// age sets the file's mtime into the past, out of the racy window, so that a stat that
// did not change is trusted.
func age(t *testing.T, path string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
}

func TestReadShapes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.json")
	writeFile(t, path, mustJSON(t, map[string]any{
		"tok":     map[string]any{"token": planted},
		"hdr":     map[string]any{"headers": map[string]any{"x-api-key": planted}},
		"basic":   map[string]any{"username": "u", "password": planted},
		"bad":     map[string]any{"token": planted, "extra": planted},
		"string":  planted,
		"number":  7,
		"nothing": map[string]any{},
	}))
	b := New(path, Options{})
	ctx := context.Background()
	for id, want := range map[string]string{"tok": "Authorization", "hdr": "X-Api-Key", "basic": "Authorization"} {
		sec, version, err := b.Read(ctx, id)
		hs := sec.Headers
		if err != nil || len(hs) != 1 || hs[0].Name != want || len(version) != len("hmac:")+16 {
			t.Errorf("%s: %v %q %v", id, hs, version, err)
		}
	}
	for _, id := range []string{"bad", "string", "number", "nothing"} {
		_, _, err := b.Read(ctx, id)
		if !errors.Is(err, credential.ErrInvalid) || !strings.Contains(err.Error(), "credential "+id+":") {
			t.Errorf("%s: %v", id, err)
		}
		if err != nil && strings.Contains(err.Error(), planted) {
			t.Errorf("%s: error shows the secret: %v", id, err)
		}
	}
	if _, _, err := b.Read(ctx, "absent"); !errors.Is(err, credential.ErrNotFound) {
		t.Errorf("absent: %v", err)
	}
}

func TestWholeFileFailures(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"corrupt":   `{"a": {"token": "` + planted + `"}` + planted,
		"truncated": `{"a": {"token": "` + planted,
		"array":     `["` + planted + `"]`,
		"string":    `"` + planted + `"`,
		"null":      `null`,
		"empty":     ``,
		"too large": `{"a": {"token": "` + strings.Repeat("x", maxFileBytes) + `"}}`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
		writeFile(t, path, content)
		_, _, err := New(path, Options{}).Read(context.Background(), "a")
		if err == nil || errors.Is(err, credential.ErrNotFound) || errors.Is(err, credential.ErrInvalid) {
			t.Errorf("%s: want a failed read, got %v", name, err)
			continue
		}
		if strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error must name the file and not its content: %v", name, err)
		}
	}
	_, _, err := New(filepath.Join(dir, "missing.json"), Options{}).Read(context.Background(), "a")
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, credential.ErrNotFound) {
		t.Errorf("missing file: %v", err)
	}
}

// TestSyntaxErrorPosition: a syntax error is located at its byte, as in the
// policy and hooks.json.
func TestSyntaxErrorPosition(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.json")
	writeFile(t, path, "{\"a\": {\"token\": \"x\"},\n  }")
	_, _, err := New(path, Options{}).Read(context.Background(), "a")
	if err == nil || !strings.Contains(err.Error(), "syntax error at line 2, column 3") {
		t.Errorf("err %v, want the '}' at line 2, column 3", err)
	}
}

func TestVersionFollowsTheSecret(t *testing.T) {
	dir := t.TempDir()
	version := func(content string) string {
		path := filepath.Join(dir, "c.json")
		writeFile(t, path, content)
		_, v, err := New(path, Options{}).Read(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v1 := version(`{"a": {"username": "u", "password": "p"}, "b": {"token": "x"}}`)
	if v2 := version("{\n  \"b\": {\"token\": \"y\"},\n  \"a\": {\"password\": \"p\", \"username\": \"u\"}\n}"); v2 != v1 {
		t.Errorf("same secret, other layout and neighbours: %s != %s", v2, v1)
	}
	if v3 := version(`{"a": {"username": "u", "password": "q"}}`); v3 == v1 {
		t.Error("another secret kept the version")
	}
	// The version is keyed: not the plain hash, which would let log readers test
	// guesses of the password offline.
	if plain := "e9f9f6c126ca4e48"; strings.Contains(v1, plain) || !strings.HasPrefix(v1, "hmac:") {
		t.Errorf("version %s is not a keyed fingerprint", v1)
	}
}

func TestParsedOncePerChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	writeFile(t, path, `{"a": {"token": "1"}, "b": {"token": "2"}}`)
	age(t, path)
	b := New(path, Options{})
	ctx := context.Background()
	b.Read(ctx, "a")
	first := b.snap
	b.Read(ctx, "b")
	b.Read(ctx, "a")
	if b.snap != first {
		t.Error("an unchanged file was re-read")
	}
	// Touched: re-read, same content, not re-parsed.
	now := time.Now()
	os.Chtimes(path, now, now)
	b.Read(ctx, "b")
	if b.snap == first || b.snap.gen != first.gen {
		t.Errorf("touch: snapshot %p gen %d, first %p gen %d", b.snap, b.snap.gen, first, first.gen)
	}
	if &b.snap.entries["a"].secret.Headers[0] != &first.entries["a"].secret.Headers[0] {
		t.Error("touch re-parsed an unchanged content")
	}
	writeFile(t, path, `{"a": {"token": "3"}, "b": {"token": "2"}}`)
	b.Read(ctx, "b")
	if b.snap.gen != first.gen+1 {
		t.Errorf("rewrite: gen %d, want %d", b.snap.gen, first.gen+1)
	}
}

func TestWorldReadableWarnsOnce(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	for _, mode := range []os.FileMode{0o600, 0o640, 0o644, 0o604} {
		path := filepath.Join(dir, mode.String()+".json")
		writeFile(t, path, `{"a": {"token": "`+planted+`"}}`)
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		buf.Reset()
		b := New(path, Options{Log: zerolog.New(&buf)})
		for range 3 {
			b.Read(context.Background(), "a")
			b.load(true)
		}
		n := strings.Count(buf.String(), "credentials file is readable by every user")
		if want := int(mode & 0o004 >> 2); n != want {
			t.Errorf("%v: %d warnings, want %d: %s", mode, n, want, buf.String())
		}
	}
}

// watcher runs Watch and counts its onChange calls.
type watcher struct {
	mu      sync.Mutex
	changes int
}

func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changes
}

func startWatch(t *testing.T, b *Backend) *watcher {
	w := &watcher{}
	ctx, cancel := context.WithCancel(context.Background())
	b.Watch(ctx, func() { w.mu.Lock(); w.changes++; w.mu.Unlock() })
	t.Cleanup(cancel)
	return w
}

// waitChanges waits until w has seen at least n changes, lets a few more polls pass, and
// returns the count.
func waitChanges(t *testing.T, w *watcher, n int, what string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.count() < n && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	got := w.count()
	if got < n {
		t.Fatalf("%s: %d changes, want %d", what, got, n)
	}
	return got
}

// exactly fails unless waitChanges saw exactly n changes.
func exactly(t *testing.T, got, n int, what string) {
	t.Helper()
	if got != n {
		t.Fatalf("%s: %d changes, want %d", what, got, n)
	}
}

func TestWatchNoticesChanges(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	writeFile(t, path, `{"a": {"token": "one"}}`)
	b := New(path, Options{PollInterval: 5 * time.Millisecond})
	w := startWatch(t, b)
	exactly(t, waitChanges(t, w, 1, "first poll"), 1, "first poll")

	exactly(t, waitChanges(t, w, 1, "nothing"), 1, "no change")

	writeFile(t, path, `{"a": {"token": "two"}}`)
	exactly(t, waitChanges(t, w, 2, "rename over"), 2, "rename over")

	// In place and the same size: a poll may also see the truncated file in between.
	if err := os.WriteFile(path, []byte(`{"a": {"token": "six"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	n := waitChanges(t, w, 3, "in-place rewrite")
	if n > 4 {
		t.Fatalf("in-place rewrite: %d changes", n)
	}
	if got, _, _ := b.Read(context.Background(), "a"); got.Headers[0].Value != "Bearer six" {
		t.Fatalf("in-place rewrite: %v", got)
	}

	now := time.Now()
	os.Chtimes(path, now, now)
	exactly(t, waitChanges(t, w, n, "touch"), n, "touch without a content change")

	os.Remove(path)
	exactly(t, waitChanges(t, w, n+1, "deletion"), n+1, "deletion")

	writeFile(t, path, `{"a": {"token": "six"}}`)
	exactly(t, waitChanges(t, w, n+2, "restore"), n+2, "restore")

	writeFile(t, path, `{"a": {"token": "six"`)
	exactly(t, waitChanges(t, w, n+3, "corruption"), n+3, "corruption")
}

// TestWatchSameStatNewContent: a write that keeps size, mtime and inode is caught by the
// periodic re-hash.
func TestWatchSameStatNewContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	writeFile(t, path, `{"a": {"token": "one"}}`)
	age(t, path)
	fi, _ := os.Stat(path)
	b := New(path, Options{PollInterval: 2 * time.Millisecond})
	w := startWatch(t, b)
	waitChanges(t, w, 1, "first poll")
	// Stop the watcher's loads while the file is rewritten: it must only see the end state.
	b.mu.Lock()
	if err := os.WriteFile(path, []byte(`{"a": {"token": "two"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, fi.ModTime(), fi.ModTime())
	b.mu.Unlock()
	if fi2, _ := os.Stat(path); keyOf(fi2) != keyOf(fi) {
		t.Fatal("the stat changed; the test needs it equal")
	}
	exactly(t, waitChanges(t, w, 2, "same stat, new content"), 2, "same stat, new content")
}

// TestConfigMapSymlinkSwap follows the Kubernetes volume layout: c.json -> ..data/c.json,
// ..data -> ..v1; an update writes ..v2 and renames a new ..data link over the old one.
func TestConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	for v, tok := range map[string]string{"..v1": "one", "..v2": "two"} {
		os.Mkdir(filepath.Join(dir, v), 0o700)
		writeFile(t, filepath.Join(dir, v, "c.json"), `{"a": {"token": "`+tok+`"}}`)
	}
	must(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/c.json", filepath.Join(dir, "c.json")))
	b := New(filepath.Join(dir, "c.json"), Options{PollInterval: 5 * time.Millisecond})
	w := startWatch(t, b)
	waitChanges(t, w, 1, "first poll")
	hs, v1, _ := b.Read(context.Background(), "a")
	if hs.Headers[0].Value != "Bearer one" {
		t.Fatalf("before the swap: %v", hs)
	}

	must(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	exactly(t, waitChanges(t, w, 2, "symlink swap"), 2, "symlink swap")
	hs, v2, _ := b.Read(context.Background(), "a")
	if hs.Headers[0].Value != "Bearer two" || v2 == v1 {
		t.Errorf("after the swap: %v %s", hs, v2)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestWatchSharesOnePoll: Backends watching one path share one poller, which keeps no
// parsed content; each still sees every change, and the poller stops with the last.
func TestWatchSharesOnePoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	writeFile(t, path, `{"a": {"token": "one"}}`)
	const n = 20
	var ws []*watcher
	var bs []*Backend
	for range n {
		b := New(path, Options{PollInterval: 5 * time.Millisecond})
		bs = append(bs, b)
		ws = append(ws, startWatch(t, b))
	}
	for _, w := range ws {
		waitChanges(t, w, 1, "first poll")
	}
	key := pollKey{path: path, every: 5 * time.Millisecond}
	pollers.mu.Lock()
	p, count := pollers.m[key], len(pollers.m)
	pollers.mu.Unlock()
	if p == nil || count != 1 {
		t.Fatalf("%d pollers, want one for %s", count, path)
	}
	writeFile(t, path, `{"a": {"token": "two"}}`)
	for i, w := range ws {
		exactly(t, waitChanges(t, w, 2, "rename over"), 2, "rename over")
		if got, _, _ := bs[i].Read(context.Background(), "a"); got.Headers[0].Value != "Bearer two" {
			t.Fatalf("watcher %d reads %v", i, got)
		}
	}
	p.probe.mu.Lock()
	kept := p.probe.snap.entries
	p.probe.mu.Unlock()
	if kept != nil {
		t.Fatal("the shared poller keeps the file's parsed secrets")
	}
}

// TestPollerStopsWithTheLastWatch: no poller outlives the Backends watching its path.
func TestPollerStopsWithTheLastWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.json")
	writeFile(t, path, `{"a": {"token": "one"}}`)
	key := pollKey{path: path, every: 5 * time.Millisecond}
	var cancels []context.CancelFunc
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		New(path, Options{PollInterval: 5 * time.Millisecond}).Watch(ctx, func() {})
		cancels = append(cancels, cancel)
	}
	running := func() bool {
		pollers.mu.Lock()
		defer pollers.mu.Unlock()
		return pollers.m[key] != nil
	}
	eventuallyTrue(t, "a poller", running)
	for _, cancel := range cancels[:len(cancels)-1] {
		cancel()
	}
	eventuallyTrue(t, "one watcher left", func() bool { // leaving follows the cancel asynchronously
		pollers.mu.Lock()
		defer pollers.mu.Unlock()
		p := pollers.m[key]
		if p == nil {
			t.Fatal("the poller stopped with a watcher left")
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.subs) == 1
	})
	cancels[len(cancels)-1]()
	eventuallyTrue(t, "stopped poller", func() bool { return !running() })
}

func eventuallyTrue(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Backends of one file share its parse (a node's sandboxes each read the node's
// file: one copy of its secrets, not one per sandbox); a changed file is parsed
// anew, and a parse no Backend holds is let go.
func TestBackendsShareTheParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "creds.json")
	writeFile(t, path, `{"a": {"token": "one"}}`)
	b1, b2 := New(path, Options{}), New(path, Options{})
	for _, b := range []*Backend{b1, b2} {
		if _, _, err := b.Read(context.Background(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	if b1.snap.parsed == nil || b1.snap.parsed != b2.snap.parsed {
		t.Fatal("two Backends of one file hold two parses")
	}
	first := b1.snap.parsed
	writeFile(t, path, `{"a": {"token": "two"}}`)
	b1.load(true)
	if b1.snap.parsed == first {
		t.Fatal("a changed file kept the old parse")
	}
	if sec, _, _ := b1.Read(context.Background(), "a"); sec.Headers[0].Value != "Bearer two" {
		t.Errorf("after the change: %v", sec.Headers)
	}
	b1, b2, first = nil, nil, nil
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		parses.mu.Lock()
		n := len(parses.m)
		parses.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d parses kept with no Backend left", n)
		}
	}
}
