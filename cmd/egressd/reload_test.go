package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// These tests reload a running `egressd run` (see run_test.go) through POST /v1/reload,
// SIGHUP and a change to its files, alone and under load. Their policy lives in its own
// file (policy.file), which they rewrite as an operator or a Kubernetes ConfigMap would.
// Everything is on 127.0.0.1; every loop and wait is bounded.

// watchWithin bounds how long a file change may take to be in force: a poll (1 s), the
// settle time (500 ms) and the reload, with room for a busy machine.
const watchWithin = 3 * time.Second

// fileConfig is a config whose policy is the file at policy; extra is appended YAML.
func fileConfig(policy, extra string) string {
	return fmt.Sprintf(`version: 1
environment: env_reload
listeners:
  - {name: sandbox, address: "127.0.0.1:0", mode: proxy, role: sandbox}
admin: {address: "127.0.0.1:0"}
policy: {file: %q}
network:
  unsafe_allow_cidrs: [127.0.0.0/8, "::1/128"]
credentials: {file: credentials.json}
log: {level: info, format: json}
%s`, policy, extra)
}

// allowOnly is a policy that allows each host on port alone.
func allowOnly(port int, hosts ...string) string {
	entries := make([]string, len(hosts))
	for i, h := range hosts {
		entries[i] = fmt.Sprintf(`{"domain": %q, "ports": [%d]}`, h, port)
	}
	return `{"allowlist": [` + strings.Join(entries, ", ") + `]}`
}

// writeAtomic replaces path the way careful tools do: write a temporary file beside it,
// then rename it over path, so a reader sees the old file or the new one, never half.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startWithPolicy writes policy into a file of its own and starts egressd on a config
// (fileConfig plus extra) that names it; it returns the runner and the policy's path.
// startWithHooksFile starts egressd with policy and an empty hooks.file; it returns
// the runner, the policy file and the hooks file, which tests rewrite to reload.
func startWithHooksFile(t *testing.T, policy string) (*runner, string, string) {
	t.Helper()
	hooksPath := filepath.Join(t.TempDir(), "hooks.json")
	if err := os.WriteFile(hooksPath, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, pol := startWithPolicy(t, policy, fmt.Sprintf("hooks: {file: %q}\n", hooksPath))
	return d, pol, hooksPath
}

func startWithPolicy(t *testing.T, policy, extra string) (*runner, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "environment.json")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	return startRunner(t, fileConfig(path, extra)), path
}

// reloadResponse is the body of POST /v1/reload.
type reloadResponse struct {
	Result     string           `json:"result"`
	ConfigHash string           `json:"config_hash"`
	Problems   []config.Problem `json:"problems"`
}

// postReload calls POST /v1/reload and decodes its answer. It may run off the test's
// goroutine, so it reports trouble as an error.
func (d *runner) postReload() (int, reloadResponse, error) {
	c := &http.Client{Timeout: waitTimeout}
	res, err := c.Post("http://"+d.Admin+"/v1/reload", "", nil)
	if err != nil {
		return 0, reloadResponse{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, reloadResponse{}, err
	}
	var r reloadResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return res.StatusCode, r, fmt.Errorf("not JSON: %v\n%s", err, body)
	}
	return res.StatusCode, r, nil
}

// mustReload calls POST /v1/reload and checks its status and result.
func (d *runner) mustReload(wantCode int) reloadResponse {
	d.t.Helper()
	code, r, err := d.postReload()
	if err != nil {
		d.t.Fatalf("POST /v1/reload: %v", err)
	}
	wantResult := map[int]string{http.StatusOK: "ok", http.StatusUnprocessableEntity: "error"}[wantCode]
	if code != wantCode || r.Result != wantResult {
		d.t.Fatalf("POST /v1/reload: %d %+v, want %d result %q", code, r, wantCode, wantResult)
	}
	return r
}

// logCursor finds log lines, reading each line once and passing over the egress
// lines undecoded: under load egressd writes thousands of them.
type logCursor struct {
	d *runner
	c *egressdtest.Cursor
}

// cursor starts at the lines logged so far.
func (d *runner) cursor() *logCursor { return &logCursor{d: d, c: d.CursorAtEnd()} }

// wait returns the next line after the cursor that match accepts, or fails the test
// after waitTimeout. Egress lines are never matched.
func (c *logCursor) wait(desc string, match func(logLine) bool) logLine {
	c.d.t.Helper()
	l, ok := c.waitFor(waitTimeout, match)
	if !ok {
		c.d.t.Fatalf("egressd did not log %s within %v", desc, waitTimeout)
	}
	return l
}

// waitFor is wait that reports a timeout (or egressd's exit) instead of failing.
func (c *logCursor) waitFor(within time.Duration, match func(logLine) bool) (logLine, bool) {
	l, err := c.c.Wait(within, match)
	return l, err == nil
}

// reloaded and rejected match the reload log lines from source ("" for any).
func reloaded(source string) func(logLine) bool {
	return func(l logLine) bool {
		return l.Str("message") == "config reloaded" && (source == "" || l.Str("source") == source)
	}
}

func rejected(source string) func(logLine) bool {
	return func(l logLine) bool {
		return strings.HasPrefix(l.Str("message"), "reload rejected") && (source == "" || l.Str("source") == source)
	}
}

func anyReload(l logLine) bool { return reloaded("")(l) || rejected("")(l) }

// expectDecision fetches rawURL through the proxy and checks the answer: 200 with the
// upstream's body for /path, or egressd's own refusal with reason.
func expectDecision(t *testing.T, d *runner, rawURL string, status int, reason string) {
	t.Helper()
	res, body := get(t, d.proxyClient(), rawURL)
	if res.StatusCode != status || res.Header.Get("Egressd-Reason") != reason {
		t.Errorf("GET %s: %d (reason %q) %s; want %d (reason %q)", rawURL, res.StatusCode,
			res.Header.Get("Egressd-Reason"), body, status, reason)
	}
}

// hasProblem reports whether problems hold one at path (a prefix will do) in file.
func hasProblem(problems []config.Problem, path, file string) bool {
	return slices.ContainsFunc(problems, func(p config.Problem) bool {
		return strings.HasPrefix(p.Path, path) && p.File == file && p.Msg != ""
	})
}

// TestReloadAdmin: POST /v1/reload with a broken policy answers 422 with the problems
// and their paths, and changes nothing; with a valid one it answers 200 with the new
// hash and the new policy decides the next request.
func TestReloadAdmin(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost"), "")
	local := fmt.Sprintf("http://localhost:%d/admin", up.port)
	ip := fmt.Sprintf("http://127.0.0.1:%d/admin", up.port)
	expectDecision(t, d, local, http.StatusOK, "")
	expectDecision(t, d, ip, http.StatusForbidden, "not_allowlisted")
	hash0 := d.configHash()

	for _, tc := range []struct {
		name, policy, path string
	}{
		{"bad entry", `{"allowlist": [{"domain": "*"}, {"domain": "bad domain"}]}`, "allowlist[1].domain"},
		{"no ports", `{"allowlist": [{"domain": "127.0.0.1", "ports": []}]}`, "allowlist[0].ports"},
		{"truncated", `{"allowlist": [{"domain": "127.0.0.1"`, ""},
		{"empty", "", ""},
	} {
		logs := d.cursor()
		writeAtomic(t, pol, tc.policy)
		r := d.mustReload(http.StatusUnprocessableEntity)
		if !hasProblem(r.Problems, tc.path, pol) {
			t.Errorf("%s: problems %+v; want one at %q in %s", tc.name, r.Problems, tc.path, pol)
		}
		l := logs.wait("reload rejected", rejected(daemon.ReloadAdmin))
		if l.Str("level") != "error" || !strings.Contains(fmt.Sprint(l["problems"]), pol) {
			t.Errorf("%s: reload rejected line %v; want level error and the problems naming %s", tc.name, l, pol)
		}
		expectDecision(t, d, local, http.StatusOK, "")
		expectDecision(t, d, ip, http.StatusForbidden, "not_allowlisted")
		if h := d.configHash(); h != hash0 {
			t.Errorf("%s: config_hash %s after a rejected reload, want %s", tc.name, h, hash0)
		}
		assertLastReload(t, d, "error", pol)
	}
	// The watcher saw the broken file too, but the reload that read it was enough.
	logs := d.cursor()
	if l, ok := logs.waitFor(watchWithin, anyReload); ok {
		t.Errorf("the policy a POST had rejected was reloaded again: %v", l)
	}

	writeAtomic(t, pol, allowOnly(up.port, "127.0.0.1"))
	r := d.mustReload(http.StatusOK)
	if r.ConfigHash == "" || r.ConfigHash == hash0 || r.ConfigHash != d.configHash() {
		t.Errorf("POST /v1/reload answered config_hash %q; want a new one (not %s), the one /healthz shows (%s)",
			r.ConfigHash, hash0, d.configHash())
	}
	l := logs.wait("config reloaded", reloaded(daemon.ReloadAdmin))
	if l.Str("config_hash") != r.ConfigHash || l.Num("rules") != 1 || l.Num("hooks") != 0 {
		t.Errorf("config reloaded line %v; want config_hash %s, rules 1, hooks 0", l, r.ConfigHash)
	}
	if creds, ok := l["credentials"].([]any); !ok || len(creds) != 0 {
		t.Errorf("config reloaded line credentials = %v, want []", l["credentials"])
	}
	expectDecision(t, d, local, http.StatusForbidden, "not_allowlisted")
	expectDecision(t, d, ip, http.StatusOK, "")
	assertReloads(t, d, 1, 4)
	assertLastReload(t, d, "ok", "")
}

// assertLastReload checks that /healthz and /readyz show the last reload's result,
// and for a rejected one its error naming errIn.
func assertLastReload(t *testing.T, d *runner, result, errIn string) {
	t.Helper()
	for _, path := range []string{"/healthz", "/readyz"} {
		var body struct {
			LastReload *struct {
				Result, Source, Error string
				At                    time.Time
			} `json:"last_reload"`
		}
		d.adminJSON(path, http.StatusOK, &body)
		lr := body.LastReload
		if lr == nil || lr.Result != result || lr.Source != daemon.ReloadAdmin || time.Since(lr.At) > time.Minute ||
			(errIn == "") != (lr.Error == "") || !strings.Contains(lr.Error, errIn) {
			t.Errorf("%s last_reload = %+v; want result %s from %s, recent, error naming %q", path, lr, result, daemon.ReloadAdmin, errIn)
		}
	}
}

// TestReloadConcurrentPosts: reloads are serialised; concurrent callers each get their
// answer, and every one of them reloaded.
func TestReloadConcurrentPosts(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, _ := startWithPolicy(t, allowOnly(up.port, "localhost"), "")
	hash := d.configHash()
	const callers = 6
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			code, r, err := d.postReload()
			if err == nil && (code != http.StatusOK || r.ConfigHash != hash) {
				err = fmt.Errorf("%d %+v, want 200 with config_hash %s", code, r, hash)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent POST /v1/reload: %v", err)
		}
	}
	assertReloads(t, d, callers, 0)
}

// TestReloadHooksFile: a hooks.file that does not parse rejects the reload, with its
// problems located in that file; fixing it reloads (the watcher watches hooks.file).
func TestReloadHooksFile(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, _, hooksPath := startWithHooksFile(t, allowOnly(up.port, "localhost"))
	local := fmt.Sprintf("http://localhost:%d/hooks", up.port)
	hash0 := d.configHash()

	writeAtomic(t, hooksPath, `{"gate": {"enabled": "yes"}}`)
	r := d.mustReload(http.StatusUnprocessableEntity)
	if !hasProblem(r.Problems, "gate.enabled", hooksPath) {
		t.Errorf("problems %+v; want gate.enabled in %s", r.Problems, hooksPath)
	}
	expectDecision(t, d, local, http.StatusOK, "")

	logs := d.cursor()
	os.Remove(hooksPath)
	r = d.mustReload(http.StatusUnprocessableEntity)
	if !hasProblem(r.Problems, "hooks.file", hooksPath) {
		t.Errorf("problems %+v; want hooks.file naming %s", r.Problems, hooksPath)
	}

	writeAtomic(t, hooksPath, `{"gate": {"enabled": true}}`)
	l := logs.wait("a reload of the fixed hooks.file", reloaded(daemon.ReloadFile))
	if l.Str("config_hash") == hash0 {
		t.Errorf("config reloaded with config_hash %s unchanged: the hash covers hooks.json", hash0)
	}
	expectDecision(t, d, local, http.StatusOK, "")
}

// TestReloadFileWatch: the watcher reloads on a change to the policy file (replaced by
// rename) and to the config file; a broken write is rejected and the policy in force
// stays; the fix applies; a touch that changes no byte reloads nothing.
func TestReloadFileWatch(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost"), "")
	local := fmt.Sprintf("http://localhost:%d/watch", up.port)
	ip := fmt.Sprintf("http://127.0.0.1:%d/watch", up.port)
	hash0 := d.configHash()

	logs := d.cursor()
	written := time.Now()
	writeAtomic(t, pol, allowOnly(up.port, "127.0.0.1"))
	l := logs.wait("a reload of the new policy", reloaded(daemon.ReloadFile))
	if took := time.Since(written); took > watchWithin {
		t.Errorf("the new policy took %v to apply, want at most %v", took, watchWithin)
	}
	hash1 := l.Str("config_hash")
	if hash1 == hash0 || d.configHash() != hash1 {
		t.Errorf("config_hash after the change %s (healthz %s), want a new one (not %s)", hash1, d.configHash(), hash0)
	}
	expectDecision(t, d, local, http.StatusForbidden, "not_allowlisted")
	expectDecision(t, d, ip, http.StatusOK, "")

	writeAtomic(t, pol, `{"allowlist": [{"domain": "*"}, {"domain": "localhost", "ports": [0]}]}`)
	l = logs.wait("the broken policy rejected", rejected(daemon.ReloadFile))
	if !strings.Contains(fmt.Sprint(l["problems"]), "allowlist[1].ports") {
		t.Errorf("reload rejected line %v; want the problem at allowlist[1].ports", l)
	}
	expectDecision(t, d, local, http.StatusForbidden, "not_allowlisted")
	expectDecision(t, d, ip, http.StatusOK, "")
	if h := d.configHash(); h != hash1 {
		t.Errorf("config_hash %s after a rejected reload, want %s", h, hash1)
	}
	if l, ok := logs.waitFor(watchWithin, anyReload); ok {
		t.Errorf("the rejected policy was reloaded again before it changed: %v", l)
	}

	writeAtomic(t, pol, allowOnly(up.port, "localhost"))
	logs.wait("a reload of the fixed policy", reloaded(daemon.ReloadFile))
	expectDecision(t, d, local, http.StatusOK, "")
	expectDecision(t, d, ip, http.StatusForbidden, "not_allowlisted")

	// The config file itself: a different limit is a different config.
	d.rewriteConfig(fileConfig(pol, "limits: {dial: 7s}\n"))
	l = logs.wait("a reload of the new config file", reloaded(daemon.ReloadFile))
	if l.Str("config_hash") == hash0 || l.Str("config_hash") == hash1 {
		t.Errorf("config_hash after the config changed = %s, want a new one", l.Str("config_hash"))
	}

	// A touch changes the mtime, not the content: no reload.
	future := time.Now().Add(time.Minute)
	if err := os.Chtimes(pol, future, future); err != nil {
		t.Fatal(err)
	}
	if l, ok := logs.waitFor(watchWithin, anyReload); ok {
		t.Errorf("a touch of the policy file reloaded: %v", l)
	}
	assertReloads(t, d, 3, 1)
}

// TestReloadConfigMapSwap: a Kubernetes ConfigMap volume updates by swapping a symlink
// (environment.json -> ..data/environment.json, ..data -> ..<timestamp>); the path's
// own entry never changes, yet the watcher sees the new file.
func TestReloadConfigMapSwap(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	dir := t.TempDir()
	version := func(name, policy string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "environment.json"), []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", allowOnly(up.port, "localhost"))
	pol := filepath.Join(dir, "environment.json")
	if err := os.Symlink(filepath.Join("..data", "environment.json"), pol); err != nil {
		t.Fatal(err)
	}
	d := startRunner(t, fileConfig(pol, ""))
	local := fmt.Sprintf("http://localhost:%d/cm", up.port)
	expectDecision(t, d, local, http.StatusOK, "")

	logs := d.cursor()
	version("..v2", allowOnly(up.port, "127.0.0.1"))
	logs.wait("a reload after the ConfigMap swap", reloaded(daemon.ReloadFile))
	expectDecision(t, d, local, http.StatusForbidden, "not_allowlisted")
	expectDecision(t, d, fmt.Sprintf("http://127.0.0.1:%d/cm", up.port), http.StatusOK, "")
}

// TestReloadNeedsRestart: a reload that changes the listener and admin addresses or the
// log level warns, naming each key, keeps serving where egressd started, and applies
// the rest of the config. With the DNS guard on, a new network.resolver needs no
// restart: the guard reads it from the current Snapshot on every query.
func TestReloadNeedsRestart(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	dnsGuard := "dns: {listen: \"127.0.0.1:0\"}\n"
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost"), dnsGuard)
	ports := freePorts(t, 2)
	cfg := fileConfig(pol, dnsGuard)
	cfg = strings.Replace(cfg, `address: "127.0.0.1:0", mode`, fmt.Sprintf(`address: "127.0.0.1:%d", mode`, ports[0]), 1)
	cfg = strings.Replace(cfg, `admin: {address: "127.0.0.1:0"}`, fmt.Sprintf(`admin: {address: "127.0.0.1:%d"}`, ports[1]), 1)
	cfg = strings.Replace(cfg, "level: info", "level: debug", 1)
	cfg = strings.Replace(cfg, "network:\n", "network:\n  resolver: \"127.0.0.1:9\"\n", 1)
	d.rewriteConfig(cfg)
	writeAtomic(t, pol, allowOnly(up.port, "127.0.0.1"))

	logs := d.cursor()
	d.mustReload(http.StatusOK)
	var keys []string
	for range 3 {
		l := logs.wait("a needs-a-restart warning", func(l logLine) bool {
			return strings.HasPrefix(l.Str("message"), "needs a restart")
		})
		if l.Str("level") != "warn" {
			t.Errorf("needs-a-restart line at level %q, want warn", l.Str("level"))
		}
		keys = append(keys, l.Str("key"))
	}
	if want := []string{"listeners[0]", "admin.address", "log.level"}; !slices.Equal(keys, want) {
		t.Errorf("needs-a-restart keys %q, want %q", keys, want)
	}
	// Still on the addresses it started with; the new policy is in force.
	expectDecision(t, d, fmt.Sprintf("http://127.0.0.1:%d/restart", up.port), http.StatusOK, "")
	expectDecision(t, d, fmt.Sprintf("http://localhost:%d/restart", up.port), http.StatusForbidden, "not_allowlisted")
	if _, ok := logs.waitFor(200*time.Millisecond, func(l logLine) bool { return l.Str("level") == "debug" }); ok {
		t.Error("a debug line after the reload: log.level changed without a restart")
	}
}

// TestReloadTurnsOnUnsafe: a reload that turns network.unsafe_allow_cidrs on logs the
// warning start logs, and opens what it names.
func TestReloadTurnsOnUnsafe(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	safe := strings.Replace(runConfig(runOpts{ports: []int{up.port}}), `  unsafe_allow_cidrs: [127.0.0.0/8, "::1/128"]`, "  allow_cidrs: [10.0.0.0/8]", 1)
	d := startRunner(t, safe)
	target := fmt.Sprintf("http://localhost:%d/unsafe", up.port)
	expectDecision(t, d, target, http.StatusForbidden, "internal_address")
	unsafeLine := func(l logLine) bool { return l.Str("message") == daemon.UnsafeWarning && l.Str("level") == "warn" }
	if slices.ContainsFunc(d.lines(), unsafeLine) {
		t.Fatal("the unsafe warning was logged at a start without network.unsafe_allow_cidrs")
	}

	logs := d.cursor()
	d.rewriteConfig(runConfig(runOpts{ports: []int{up.port}}))
	d.mustReload(http.StatusOK)
	logs.wait("the unsafe warning", unsafeLine)
	expectDecision(t, d, target, http.StatusOK, "")
}

// loadResult is one request the load made.
type loadResult struct {
	client     int
	url        string
	start, end time.Time
	status     int
	reason     string
	body       string
	err        error
}

// loadGen makes requests through egressd from several clients, each with its own
// keep-alive connection, each cycling through urls, until stopped.
type loadGen struct {
	wg      sync.WaitGroup
	stop    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	results [][]loadResult // by client, in order
}

// maxLoad bounds a load that is never stopped.
const maxLoad = 60 * time.Second

// startLoad starts the load; it is stopped at the end of the test at the latest.
func startLoad(d *runner, clients int, urls []string) *loadGen {
	ld := &loadGen{stop: make(chan struct{}), results: make([][]loadResult, clients)}
	d.t.Cleanup(func() { ld.finish() })
	deadline := time.Now().Add(maxLoad)
	for i := range clients {
		c := d.proxyClient()
		ld.wg.Go(func() {
			defer c.CloseIdleConnections()
			for n := 0; time.Now().Before(deadline); n++ {
				select {
				case <-ld.stop:
					return
				default:
				}
				r := fetch(c, urls[(n+i)%len(urls)])
				r.client = i
				ld.mu.Lock()
				ld.results[i] = append(ld.results[i], r)
				ld.mu.Unlock()
				time.Sleep(time.Millisecond) // leave the machine some room for the reloads
			}
		})
	}
	return ld
}

// finish stops the load and returns every client's results.
func (ld *loadGen) finish() [][]loadResult {
	ld.once.Do(func() { close(ld.stop) })
	ld.wg.Wait()
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.results
}

func fetch(c *http.Client, rawURL string) loadResult {
	r := loadResult{url: rawURL, start: time.Now()}
	res, err := c.Get(rawURL)
	if err != nil {
		r.err = err
		r.end = time.Now()
		return r
	}
	defer res.Body.Close()
	var body bytes.Buffer
	_, r.err = io.Copy(&body, res.Body)
	r.status, r.reason, r.body, r.end = res.StatusCode, res.Header.Get("Egressd-Reason"), body.String(), time.Now()
	return r
}

// verdict is what a policy answers for a URL.
type verdict struct {
	status int
	reason string
	path   string // the path the upstream echoed, for a 200
}

func (v verdict) matches(r loadResult) bool {
	return r.err == nil && r.status == v.status && r.reason == v.reason && (v.status != http.StatusOK || echoedPath(r.body) == v.path)
}

func allowedVerdict(path string) verdict {
	return verdict{status: http.StatusOK, path: path}
}

var notAllowlisted = verdict{status: http.StatusForbidden, reason: "not_allowlisted"}

// TestReloadBrokenUnderLoad: a reload with a broken policy under load changes
// nothing. 8 clients request an allowed and a denied host continuously while
// ten reloads of a broken policy come by POST /v1/reload, SIGHUP and the file watcher
// in turn. Every allowed request must get its 200 from the upstream and every denied
// one the 403 not_allowlisted: no failure, no changed answer. The broken policies
// include one that would allow everything if any part of it were applied.
func TestReloadBrokenUnderLoad(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost"), "")
	hash0 := d.configHash()
	allowed := fmt.Sprintf("http://localhost:%d/load", up.port)
	denied := "http://denied.test/load"
	want := map[string]verdict{allowed: allowedVerdict("/load"), denied: notAllowlisted}

	broken := func(i int) string {
		switch i % 4 {
		case 0: // would open everything, were it applied in part
			return fmt.Sprintf(`{"allowlist": [{"domain": "*"}, {"domain": "bad domain %d"}]}`, i)
		case 1: // half-written
			return fmt.Sprintf(`{"allowlist": [{"domain": "denied.test"}, {"domain": "localhost", "ports": [%d`, up.port)[:30+i]
		case 2: // truncated to nothing, as a writer that is not atomic leaves it
			return strings.Repeat("\n", i)
		default: // valid JSON, invalid policy
			return fmt.Sprintf(`{"allowlist": [{"domain": "denied.test", "ports": [%d, 0]}]}`, i)
		}
	}

	start := time.Now()
	ld := startLoad(d, 8, []string{allowed, denied})
	time.Sleep(200 * time.Millisecond) // traffic before the first reload
	logs := d.cursor()
	for i := range 10 {
		writeAtomic(t, pol, broken(i))
		switch i % 3 {
		case 0:
			r := d.mustReload(http.StatusUnprocessableEntity)
			if len(r.Problems) == 0 || r.Problems[0].File != pol {
				t.Errorf("reload %d (POST): problems %+v, want them in %s", i, r.Problems, pol)
			}
			logs.wait(fmt.Sprintf("reload %d (POST) rejected", i), rejected(daemon.ReloadAdmin))
		case 1:
			d.signal(syscall.SIGHUP)
			logs.wait(fmt.Sprintf("reload %d (SIGHUP) rejected", i), rejected(daemon.ReloadSignal))
		case 2:
			logs.wait(fmt.Sprintf("reload %d (file) rejected", i), rejected(daemon.ReloadFile))
		}
	}
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	results := ld.finish()

	var total, failed int
	for _, rs := range results {
		for _, r := range rs {
			total++
			if !want[r.url].matches(r) {
				if failed++; failed <= 10 {
					t.Errorf("client %d: GET %s at +%v: %d (reason %q) %q err %v; want %+v", r.client, r.url,
						r.start.Sub(start).Round(time.Millisecond), r.status, r.reason, r.body, r.err, want[r.url])
				}
			}
		}
	}
	t.Logf("%d requests from 8 clients over %v, %d failed or changed", total, time.Since(start).Round(time.Millisecond), failed)
	if total < 100 {
		t.Errorf("only %d requests made; the load did not run", total)
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed or were answered differently during the broken reloads", failed, total)
	}
	if h := d.configHash(); h != hash0 {
		t.Errorf("config_hash %s after broken reloads, want %s", h, hash0)
	}
	if ok := d.metric(`egressd_config_reloads_total{result="ok"}`); ok != 0 {
		t.Errorf(`config_reloads_total{result="ok"} = %v, want 0`, ok)
	}
	if failed := d.metric(`egressd_config_reloads_total{result="error"}`); failed < 10 {
		t.Errorf(`config_reloads_total{result="error"} = %v, want at least 10`, failed)
	}
	for _, uri := range up.requests() {
		if uri != "/load" {
			t.Errorf("the upstream received %s", uri)
		}
	}
}

// TestReloadValidUnderLoad: a valid reload that swaps which of two names is allowed,
// under the same load. Nothing fails; a request held in flight across the swap finishes
// on the policy it started with; each client, once it has seen the new policy, never
// sees the old one again; every request answered before the reload was asked for saw
// the old policy and every request started after it returned sees the new one.
func TestReloadValidUnderLoad(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost"), "")
	byName := fmt.Sprintf("http://localhost:%d/load", up.port)
	byIP := fmt.Sprintf("http://127.0.0.1:%d/load", up.port)
	before := map[string]verdict{byName: allowedVerdict("/load"), byIP: notAllowlisted}
	after := map[string]verdict{byName: notAllowlisted, byIP: allowedVerdict("/load")}

	// A request in flight across the swap, allowed by the policy it started with.
	held := make(chan loadResult, 1)
	go func() { held <- fetch(d.proxyClient(), fmt.Sprintf("http://localhost:%d/slow", up.port)) }()
	select {
	case <-up.slowStarted:
	case <-time.After(waitTimeout):
		t.Fatal("the held request never reached the upstream")
	}

	start := time.Now()
	ld := startLoad(d, 8, []string{byName, byIP})
	time.Sleep(time.Second)
	writeAtomic(t, pol, allowOnly(up.port, "127.0.0.1"))
	asked := time.Now()
	d.mustReload(http.StatusOK)
	answered := time.Now()
	up.releaseSlow()
	time.Sleep(time.Second)
	results := ld.finish()

	if r := <-held; !allowedVerdict("/slow").matches(r) {
		t.Errorf("the request in flight across the reload: %d %q err %v; want 200 from the upstream", r.status, r.body, r.err)
	}
	var total, old, fresh, failed int
	fail := func(r loadResult, why string) {
		if failed++; failed <= 10 {
			t.Errorf("client %d: GET %s (+%v to +%v): %d (reason %q) err %v: %s", r.client, r.url,
				r.start.Sub(start).Round(time.Millisecond), r.end.Sub(start).Round(time.Millisecond), r.status, r.reason, r.err, why)
		}
	}
	for _, rs := range results {
		seenNew := false
		for _, r := range rs {
			total++
			isOld, isNew := before[r.url].matches(r), after[r.url].matches(r)
			switch {
			case !isOld && !isNew:
				fail(r, "answered by neither policy")
			case isOld && seenNew:
				fail(r, "the old policy after this client had seen the new one")
			case isOld && r.start.After(answered):
				fail(r, "the old policy, started after the reload had returned")
			case isNew && r.end.Before(asked):
				fail(r, "the new policy, answered before the reload was asked for")
			case isOld:
				old++
			default:
				seenNew = true
				fresh++
			}
		}
	}
	t.Logf("%d requests from 8 clients over %v: %d on the old policy, %d on the new, %d wrong",
		total, time.Since(start).Round(time.Millisecond), old, fresh, failed)
	if old == 0 || fresh == 0 {
		t.Errorf("%d requests on the old policy and %d on the new; want some of each", old, fresh)
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed or were answered by the wrong policy", failed, total)
	}
	expectDecision(t, d, byName, http.StatusForbidden, "not_allowlisted")
	expectDecision(t, d, byIP, http.StatusOK, "")
	assertReloads(t, d, 1, 0)
}

// TestReloadRejectedKeepsCredentials: a reload rejected after its new credential store
// was built (here: the policy names another credential, hooks.file is broken) leaves
// the running store in place, so the policy still in force keeps injecting.
func TestReloadRejectedKeepsCredentials(t *testing.T) {
	t.Parallel()
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+demoToken {
			io.WriteString(w, "credential injected")
			return
		}
		io.WriteString(w, "no credential")
	}))
	t.Cleanup(echo.Close)
	port := echo.Listener.Addr().(*net.TCPAddr).Port
	withCredential := func(id string) string {
		return fmt.Sprintf(`{"allowlist": [{"domain": "localhost", "ports": [%d], "credential": %q, "allow_plaintext": true}]}`, port, id)
	}
	d, pol, hooksPath := startWithHooksFile(t, withCredential("example-api"))
	target := fmt.Sprintf("http://localhost:%d/cred", port)
	check := func(when string) {
		t.Helper()
		res, body := get(t, d.proxyClient(), target)
		if res.StatusCode != http.StatusOK || body != "credential injected" {
			t.Errorf("%s: GET %s: %d (reason %q) %q, want 200 with the credential injected", when, target,
				res.StatusCode, res.Header.Get("Egressd-Reason"), body)
		}
	}
	check("at start")

	writeAtomic(t, pol, withCredential("other-api"))
	writeAtomic(t, hooksPath, `{"gate": {"enabled": "yes"}}`)
	d.mustReload(http.StatusUnprocessableEntity)
	check("after the rejected reload")
	var ready map[string]any
	d.adminJSON("/readyz", http.StatusOK, &ready)
}

// TestReloadConcurrentInProcess runs the daemon in this process, so that the race
// detector sees its reload path: reloads by POST-equivalent calls, SIGHUP-equivalent
// calls and the watcher, with the policy file rewritten under them, while requests go
// through the proxy and the admin endpoints are read. The last reload decides.
func TestReloadConcurrentInProcess(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	dir := writeFiles(t, map[string]string{
		"environment.json": allowOnly(up.port, "localhost"),
		"credentials.json": `{}`,
	})
	pol := filepath.Join(dir, "environment.json")
	cfgPath := filepath.Join(dir, "egressd.yaml")
	if err := os.WriteFile(cfgPath, []byte(fileConfig(pol, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := daemon.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	d := daemon.New(cfgPath, zerolog.New(io.Discard), metrics.New())
	if err := d.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	proxyAddr, adminAddr := d.Self()[0].String(), d.Self()[1].String()
	proxied := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr})}, Timeout: waitTimeout}
	plain := &http.Client{Timeout: waitTimeout}
	policies := []string{
		allowOnly(up.port, "localhost"),
		allowOnly(up.port, "127.0.0.1"),
		`{"allowlist": [{"domain": "*"}, {"domain": "bad domain"}]}`,
	}
	// rewrite replaces the policy through a temporary file of its own, so that
	// concurrent writers never rename each other's.
	rewrite := func(content string) error {
		f, err := os.CreateTemp(dir, "environment-*.tmp")
		if err != nil {
			return err
		}
		_, err = f.WriteString(content)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), pol)
		}
		return err
	}

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 10 {
				if err := rewrite(policies[(g+i)%len(policies)]); err != nil {
					t.Error(err)
					return
				}
				if g%2 == 0 {
					d.Reload()
				} else {
					d.Hangup()
				}
			}
		})
	}
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				target := fmt.Sprintf("http://localhost:%d/race", up.port)
				if (g+i)%2 == 1 {
					target = fmt.Sprintf("http://127.0.0.1:%d/race", up.port)
				}
				res, err := proxied.Get(target)
				if err != nil {
					t.Errorf("GET %s: %v", target, err)
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK && res.Header.Get("Egressd-Reason") != "not_allowlisted" {
					t.Errorf("GET %s: %d %s, want 200 or 403 not_allowlisted", target, res.StatusCode, res.Header.Get("Egressd-Reason"))
				}
				for _, p := range []string{"/healthz", "/readyz"} {
					if res, err := plain.Get("http://" + adminAddr + p); err == nil {
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
					}
				}
			}
		})
	}
	wg.Wait()

	if err := rewrite(policies[1]); err != nil {
		t.Fatal(err)
	}
	hash, err := d.Reload()
	if err != nil {
		t.Fatalf("the last reload: %v", err)
	}
	if h, _ := d.ConfigInfo(); h != hash {
		t.Errorf("ConfigInfo hash %s, want the last reload's %s", h, hash)
	}
	for target, want := range map[string]int{
		fmt.Sprintf("http://localhost:%d/race", up.port): http.StatusForbidden,
		fmt.Sprintf("http://127.0.0.1:%d/race", up.port): http.StatusOK,
	} {
		res, err := proxied.Get(target)
		if err != nil {
			t.Fatalf("GET %s: %v", target, err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("GET %s after the last reload: %d, want %d", target, res.StatusCode, want)
		}
	}
}

// TestReloadPinsHookLeaves: a reload that adds a hook host mints its interception
// leaf at once (pinned), so the first intercepted tunnel to it is a leaf cache hit.
func TestReloadPinsHookLeaves(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d, _, hooksPath := startWithHooksFile(t, allowOnly(up.port, "localhost"))
	writeAtomic(t, hooksPath, fmt.Sprintf(`{"gate": {"pre_tool_execution": [{"matcher": "code_execution",
		"hooks": [{"type": "http", "url": "https://localhost:%d/pre", "timeout": 5}]}]}}`, up.port))
	d.mustReload(http.StatusOK)
	hits, misses := d.metric(`egressd_leaf_cache_total{result="hit"}`), d.metric(`egressd_leaf_cache_total{result="miss"}`)
	nc, err := net.DialTimeout("tcp", d.Proxy, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(waitTimeout))
	fmt.Fprintf(nc, "CONNECT localhost:%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n", up.port, up.port)
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT to the hook host: %v %v", resp, err)
	}
	// Only the leaf matters here, not who signed it.
	if err := tls.Client(nc, &tls.Config{ServerName: "localhost", InsecureSkipVerify: true}).Handshake(); err != nil {
		t.Fatalf("TLS with the hook host's leaf: %v", err)
	}
	if h, m := d.metric(`egressd_leaf_cache_total{result="hit"}`)-hits, d.metric(`egressd_leaf_cache_total{result="miss"}`)-misses; h != 1 || m != 0 {
		t.Errorf("the first tunnel to a hook host added by reload: %v hit(s), %v miss(es); want its leaf pinned (1 hit, 0 misses)", h, m)
	}
}
