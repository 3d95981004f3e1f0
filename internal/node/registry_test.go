package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// host is a Host whose specs are the text "ok ..." (valid) or anything else (an
// error at "environment"); internal/daemon's is exercised by test/node.
type host struct {
	served, closed atomic.Int32
	failing        atomic.Bool // Serve fails, as when a spec's netns is not there yet
}

type spec struct{ id, hash string }

func (s spec) ID() string   { return s.id }
func (s spec) Hash() string { return s.hash }

type served struct{ h *host }

func (s served) Close()         { s.h.closed.Add(1) }
func (s served) Status() Status { return Status{Open: 1} }

func (h *host) Load(id string, data []byte, _ string) (Spec, []config.Problem) {
	if !strings.HasPrefix(string(data), "ok") {
		return nil, []config.Problem{{Path: "environment", Msg: "required"}}
	}
	sum := sha256.Sum256(data)
	return spec{id, hex.EncodeToString(sum[:])}, nil
}

func (h *host) Serve(s Spec, prev Sandbox) (Sandbox, error) {
	if h.failing.Load() {
		return prev, errors.New("netns: no such file or directory")
	}
	h.served.Add(1)
	if prev != nil {
		return prev, nil
	}
	return served{h}, nil
}

func TestApply(t *testing.T) {
	h := &host{}
	r := New(h, 2, zerolog.Nop())
	steps := []struct {
		id, data string
		want     Result
	}{
		{"a", "ok 1", Created}, {"a", "ok 1", Unchanged}, {"a", "ok 2", Changed},
		{"a", "bad", Refused}, {"b", "ok", Created}, {"c", "ok", Refused},
	}
	for i, s := range steps {
		if got, problems := r.Apply(s.id, []byte(s.data), "", SourceAPI); got != s.want {
			t.Errorf("step %d: Apply(%s, %q) = %v %v, want %v", i, s.id, s.data, got, problems, s.want)
		}
	}
	info, ok := r.Get("a")
	if !ok || len(info.Problems) != 1 || info.Problems[0].Path != "environment" || info.Open != 1 {
		t.Errorf("a after a refused spec: %+v, want it served with the refusal's problems", info)
	}
	if sum := sha256.Sum256([]byte("ok 2")); info.SpecHash != hex.EncodeToString(sum[:]) {
		t.Error("the refused spec replaced the one in force")
	}
	if _, problems := r.Apply("c", []byte("ok"), "", SourceAPI); len(problems) != 1 || !strings.Contains(problems[0].Msg, "max_sandboxes (2)") {
		t.Errorf("a third sandbox: %v", problems)
	}
	if r.Remove("a", SourceDir) || !r.Remove("a", SourceAPI) || r.Remove("a", "") || h.closed.Load() != 1 {
		t.Errorf("Remove: only its own source removes it, once (closed %d)", h.closed.Load())
	}
}

func TestAPI(t *testing.T) {
	r := New(&host{}, 10, zerolog.Nop())
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	call := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		has                string
	}{
		{"PUT", "/v1/sandboxes/a", "ok", 201, `{"problems":[]}`},
		{"PUT", "/v1/sandboxes/a", "ok 2", 200, `{"problems":[]}`},
		{"PUT", "/v1/sandboxes/a", "bad", 400, `"path":"environment"`},
		{"GET", "/v1/sandboxes/a", "", 200, `"open_connections":1`},
		{"GET", "/v1/sandboxes", "", 200, `{"sandboxes":["a"]}`},
		{"DELETE", "/v1/sandboxes/a", "", 204, ""},
		{"DELETE", "/v1/sandboxes/a", "", 404, "no such sandbox"},
		{"GET", "/v1/sandboxes/a", "", 404, "no such sandbox"},
	} {
		if code, body := call(c.method, c.path, c.body); code != c.code || !strings.Contains(body, c.has) {
			t.Errorf("%s %s %q: %d %s, want %d with %s", c.method, c.path, c.body, code, body, c.code, c.has)
		}
	}
}

// The directory: a new file registers its sandbox, a changed one changes it, a bad
// one is logged at WARN and changes nothing, a removed one removes it.
func TestWatchDir(t *testing.T) {
	dir := t.TempDir()
	var log syncbuf.Buffer
	r := New(&host{}, 10, zerolog.New(&log))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.ScanDir(dir).Watch(ctx)
	file := filepath.Join(dir, "sbx-1.json")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ok 1")
	waitFor(t, "registered", func() bool { _, ok := r.Get("sbx-1"); return ok })
	first, _ := r.Get("sbx-1")
	write("bad")
	waitFor(t, "the WARN line", func() bool { return strings.Contains(log.String(), `"level":"warn"`) })
	if info, _ := r.Get("sbx-1"); info.SpecHash != first.SpecHash || len(info.Problems) == 0 {
		t.Errorf("after a bad file: %+v", info)
	}
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		var line struct {
			Level, Sandbox string
			Problems       []string
		}
		json.Unmarshal([]byte(l), &line)
		if line.Level == "warn" && (line.Sandbox != "sbx-1" || len(line.Problems) != 1 || !strings.Contains(line.Problems[0], "environment")) {
			t.Errorf("WARN line %s", l)
		}
	}
	write("ok 2")
	waitFor(t, "changed", func() bool {
		info, _ := r.Get("sbx-1")
		return info.SpecHash != first.SpecHash && len(info.Problems) == 0
	})
	os.Remove(file)
	waitFor(t, "removed", func() bool { _, ok := r.Get("sbx-1"); return !ok })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 5s", what)
		}
	}
}

// A file whose spec is valid but cannot be served yet (its namespace is made after
// the spec is written) is tried again, unchanged, until it serves.
func TestWatchDirRetries(t *testing.T) {
	dirRetry = 200 * time.Millisecond
	t.Cleanup(func() { dirRetry = 5 * time.Second })
	dir := t.TempDir()
	h := &host{}
	h.failing.Store(true)
	r := New(h, 10, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := os.WriteFile(filepath.Join(dir, "sbx-1.yaml"), []byte("ok"), 0o600); err != nil {
		t.Fatal(err)
	}
	go r.ScanDir(dir).Watch(ctx)
	time.Sleep(300 * time.Millisecond)
	if _, ok := r.Get("sbx-1"); ok {
		t.Fatal("registered while Serve fails")
	}
	h.failing.Store(false)
	waitFor(t, "registered once it can be served", func() bool { _, ok := r.Get("sbx-1"); return ok })
}

// specs is a Keeper in memory.
type specs map[string]Kept

func (s specs) KeepSpec(id string, k Kept) { s[id] = k }
func (s specs) ForgetSpec(id string)       { delete(s, id) }
func (s specs) KeptSpecs() map[string]Kept { return maps.Clone(s) }
func (s specs) data() map[string]string {
	out := map[string]string{}
	for id, k := range s {
		out[id] = k.Source + ":" + string(k.Data)
	}
	return out
}

// What is put in force is kept, from either source, until it is removed; a
// refused spec never. Restore serves the kept API specs, and a file's only when
// its file is still there but was refused (the last good one), and lets go of
// what no longer validates or whose file is gone.
func TestKeepSpecs(t *testing.T) {
	dir := t.TempDir()
	kept := specs{}
	r := New(&host{}, 10, zerolog.Nop())
	r.KeepSpecs(kept)
	r.Apply("a", []byte("ok a"), "", SourceAPI)
	r.Apply("a", []byte("bad"), "", SourceAPI)
	r.Apply("b", []byte("ok b"), "", SourceAPI)
	r.Apply("b", []byte("ok b file"), dir, SourceDir)
	r.Apply("c", []byte("ok c"), dir, SourceDir)
	r.Apply("c", []byte("bad"), dir, SourceDir)
	r.Apply("d", []byte("ok d"), "", SourceAPI)
	r.Remove("d", "")
	r.Apply("e", []byte("ok e"), dir, SourceDir)
	want := map[string]string{"a": "api:ok a", "b": "dir:ok b file", "c": "dir:ok c", "e": "dir:ok e"}
	if got := kept.data(); !maps.Equal(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}

	// The next process: b's file serves it again, c's file is refused (its last
	// good spec is restored), e's file is gone, f's kept spec no longer validates.
	for name, data := range map[string]string{"b.json": "ok b file", "c.json": "bad"} {
		os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600)
	}
	kept["f"] = Kept{Source: SourceAPI, Data: []byte("bad")}
	next := New(&host{}, 10, zerolog.Nop())
	next.KeepSpecs(kept)
	next.ScanDir(dir)
	next.Restore()
	if ids := next.IDs(); !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("serving %v, want [a b c]", ids)
	}
	if info, _ := next.Get("c"); info.Source != SourceDir || info.SpecHash != hashOf("ok c") {
		t.Errorf("c: %+v, want its last good spec from the directory", info)
	}
	want = map[string]string{"a": "api:ok a", "b": "dir:ok b file", "c": "dir:ok c"}
	if got := kept.data(); !maps.Equal(got, want) {
		t.Errorf("kept %v after Restore, want %v", got, want)
	}
}

func hashOf(data string) string {
	sum := sha256.Sum256([]byte(data))
	return hex.EncodeToString(sum[:])
}

// A sandbox its spec file put in force and the API removed stays removed while
// the file is unchanged, in the next process too; a changed file brings it back,
// and a removed file takes the record with it.
func TestAPIRemovalOfAFileSandbox(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.json")
	os.WriteFile(file, []byte("ok a"), 0o600)
	kept := specs{}
	r := New(&host{}, 10, zerolog.Nop())
	r.KeepSpecs(kept)
	r.ScanDir(dir)
	if !r.Remove("a", "") {
		t.Fatal("DELETE removed nothing")
	}
	next := New(&host{}, 10, zerolog.Nop())
	next.KeepSpecs(kept)
	w := next.ScanDir(dir)
	next.Restore()
	if ids := next.IDs(); len(ids) != 0 {
		t.Fatalf("the next process serves %v: the unchanged file brought back what the API removed", ids)
	}
	os.WriteFile(file, []byte("ok a, changed"), 0o600)
	w.scan()
	if ids := next.IDs(); !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("after the file changed: %v, want [a]", ids)
	}
	next.Remove("a", "")
	os.Remove(file)
	w.scan()
	if len(kept) != 0 {
		t.Errorf("kept %v after the file is gone, want nothing", kept.data())
	}
}
