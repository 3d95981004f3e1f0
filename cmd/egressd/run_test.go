package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/explain"
	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// These tests run `egressd run` as a subprocess on loopback: the sandbox listener
// and the admin listener on 127.0.0.1, an upstream on 127.0.0.1, and a policy that
// allows only localhost, opened with network.unsafe_allow_cidrs (the development and
// test switch). Nothing leaves the machine.

// waitTimeout bounds every wait for the runner: a log line, a signal's effect, an exit.
const waitTimeout = 10 * time.Second

// egressFields are the fields of every canonical log line, present even when
// empty, so that log queries never miss a key (docs/observability.md).
var egressFields = []string{
	"req_id", "sandbox", "listener", "role", "client", "method", "scheme", "host", "port", "path",
	"decision", "reason", "rule", "intercepted", "injected", "credential", "credential_version",
	"hook_group", "hook_event", "status", "bytes_in", "bytes_out", "resolved_ip", "dur_ms",
}

// runOpts shapes the config runConfig writes.
type runOpts struct {
	listener, admin string // bound addresses; default 127.0.0.1:0
	allow           string // the one allowlisted domain; default localhost
	ports           []int  // its ports
	extra           string // appended YAML
}

func runConfig(o runOpts) string {
	if o.listener == "" {
		o.listener = "127.0.0.1:0"
	}
	if o.admin == "" {
		o.admin = "127.0.0.1:0"
	}
	if o.allow == "" {
		o.allow = "localhost"
	}
	ports := make([]string, len(o.ports))
	for i, p := range o.ports {
		ports[i] = strconv.Itoa(p)
	}
	// ::1/128 joins 127.0.0.0/8 because many hosts files map localhost to both, and
	// every address a name resolves to must pass the guard.
	return fmt.Sprintf(`version: 1
environment: env_run
listeners:
  - {name: sandbox, address: "%s", mode: proxy, role: sandbox}
admin: {address: "%s"}
policy:
  allowlist:
    - {domain: %s, ports: [%s]}
network:
  unsafe_allow_cidrs: [127.0.0.0/8, "::1/128"]
credentials: {file: credentials.json}
log: {level: info, format: json}
%s`, o.listener, o.admin, o.allow, strings.Join(ports, ", "), o.extra)
}

// logLine is one JSON line egressd wrote to stdout.
type logLine = egressdtest.Line

// runner is one `egressd run` subprocess (internal/testutil/egressdtest), with
// helpers that fail its test.
type runner struct {
	*egressdtest.Egressd
	t *testing.T
}

// startRunner writes cfg and a credentials file into a temporary directory, starts
// `egressd run --config` on it and waits for "egressd started" and both listeners.
// The process is killed at the end of the test if it is still running.
func startRunner(t *testing.T, cfg string) *runner {
	t.Helper()
	return startRunnerWith(t, cfg, map[string]string{"credentials.json": `{"example-api": {"token": "` + demoToken + `"}}`})
}

// startRunnerWith is startRunner with files (name -> content) instead of the
// credentials file.
func startRunnerWith(t *testing.T, cfg string, files map[string]string) *runner {
	t.Helper()
	e := egressdtest.StartT(t, egressdtest.Options{RawConfig: cfg, Files: files})
	if e.Admin == "" {
		t.Fatalf("no \"listening\" line for the admin listener:\n%s", e.LogBytes())
	}
	return &runner{Egressd: e, t: t}
}

// lines returns the JSON lines logged so far.
func (d *runner) lines() []logLine {
	d.t.Helper()
	lines, err := d.Lines()
	if err != nil {
		d.t.Fatal(err)
	}
	return lines
}

// parseLines decodes the JSON lines among raw.
func parseLines(raw []string) []logLine {
	out := make([]logLine, 0, len(raw))
	for _, s := range raw {
		var l logLine
		if json.Unmarshal([]byte(s), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// waitLog waits for a log line that match accepts and returns it.
func (d *runner) waitLog(desc string, match func(logLine) bool) logLine {
	d.t.Helper()
	return d.WaitLineT(d.t, desc, match)
}

// waitNth waits for the nth log line that match accepts and returns it.
func (d *runner) waitNth(desc string, n int, match func(logLine) bool) logLine {
	d.t.Helper()
	return d.WaitNthT(d.t, desc, n, match)
}

// egressLine waits for the canonical log line of the request with this ID.
func (d *runner) egressLine(reqID string) logLine {
	d.t.Helper()
	return d.EgressLine(d.t, reqID)
}

// signal sends sig once egressd's signal handlers are installed
// (egressdtest.SignalGrace after "egressd started"; see TestRunSignalRightAfterStart).
func (d *runner) signal(sig syscall.Signal) {
	d.t.Helper()
	if err := d.Signal(sig); err != nil {
		d.t.Fatalf("signal %v: %v", sig, err)
	}
}

// waitExit waits for the process to exit and returns its exit code.
func (d *runner) waitExit(within time.Duration) int {
	d.t.Helper()
	code, err := d.Wait(within)
	if err != nil {
		d.t.Fatalf("%v:\n%s", err, d.LogBytes())
	}
	return code
}

// adminGet fetches path from the admin listener.
func (d *runner) adminGet(path string) (int, string) {
	d.t.Helper()
	code, body, err := d.AdminGet(path)
	if err != nil {
		d.t.Fatalf("admin GET %s: %v", path, err)
	}
	return code, string(body)
}

// adminJSON fetches path from the admin listener and decodes its JSON body into v.
func (d *runner) adminJSON(path string, wantCode int, v any) {
	d.t.Helper()
	if err := d.AdminJSON(path, wantCode, v); err != nil {
		d.t.Fatalf("admin %v", err)
	}
}

// metric returns the value of one series from /metrics, written as Prometheus writes
// it (labels in name order), or fails the test if the series is not exported.
func (d *runner) metric(series string) float64 {
	d.t.Helper()
	return d.MetricT(d.t, series)
}

func (d *runner) lookupMetric(series string) (float64, bool) {
	d.t.Helper()
	v, ok, err := d.Metric(series)
	if err != nil {
		d.t.Fatal(err)
	}
	return v, ok
}

// waitListenerMetrics waits until the sandbox listener's series are exported.
// egressd exports them from the goroutine that serves the listener, which may run
// after "egressd started" is logged and /readyz says ready; see
// TestRunListenerMetricsAtStart.
func (d *runner) waitListenerMetrics() {
	d.t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := d.lookupMetric(zeroSeries[0]); ok {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("/metrics does not export %s %v after start", zeroSeries[0], waitTimeout)
		}
	}
}

func (d *runner) configHash() string {
	d.t.Helper()
	h, err := d.Healthz()
	if err != nil {
		d.t.Fatalf("admin %v", err)
	}
	return h.ConfigHash
}

// rewriteConfig replaces the config file the runner was started with.
func (d *runner) rewriteConfig(cfg string) {
	d.t.Helper()
	if err := os.WriteFile(d.ConfigPath, []byte(cfg), 0o600); err != nil {
		d.t.Fatal(err)
	}
}

// proxyClient returns a client that sends everything through egressd as its
// explicit proxy and does not follow redirects.
func (d *runner) proxyClient() *http.Client {
	pu := &url.URL{Scheme: "http", Host: d.Proxy}
	return &http.Client{
		Transport:     &http.Transport{Proxy: http.ProxyURL(pu)},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       waitTimeout,
	}
}

// get fetches rawURL through the proxy and returns the response with its body read.
func get(t *testing.T, c *http.Client, rawURL string) (*http.Response, string) {
	t.Helper()
	res, err := c.Get(rawURL)
	if err != nil {
		t.Fatalf("GET %s through egressd: %v", rawURL, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s through egressd: reading the body: %v", rawURL, err)
	}
	return res, string(body)
}

// denial is the JSON body of a response egressd makes itself.
type denial = egressdtest.Refusal

// assertDenied checks a response egressd made itself: status, Egressd-Reason, and a
// JSON body that agrees with them. It returns the body.
func assertDenied(t *testing.T, res *http.Response, body string, status int, reason, host string, port int) denial {
	t.Helper()
	if res.StatusCode != status || res.Header.Get("Egressd-Reason") != reason {
		t.Errorf("response %d with Egressd-Reason %q, want %d %q\n%s", res.StatusCode, res.Header.Get("Egressd-Reason"), status, reason, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var d denial
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	if d.Error != "egress_denied" || d.Reason != reason || d.Host != host || d.Port != port || d.Message == "" || d.RequestID == "" {
		t.Errorf("body %s\nwant error egress_denied, reason %s, host %s, port %d, a message and a request_id", body, reason, host, port)
	}
	return d
}

// upstream is the echo (internal/testutil/echo) on 127.0.0.1. GET /slow answers
// only when release is closed (or after waitTimeout), so a test controls how long a
// request is in flight.
type upstream struct {
	*echo.Server
	port        int
	slowStarted chan struct{}
	release     chan struct{} // closed by releaseSlow
	releaseOnce sync.Once
}

func startUpstream(t *testing.T, tlsCert *tls.Certificate) *upstream {
	t.Helper()
	u := &upstream{slowStarted: make(chan struct{}, 1), release: make(chan struct{})}
	u.Server = &echo.Server{Inspect: u.holdSlow, HTTP1Only: true}
	port, err := u.Listen("127.0.0.1:0", tlsCert)
	if err != nil {
		t.Fatal(err)
	}
	// Release a held request before Close.
	t.Cleanup(func() { u.releaseSlow(); u.Close() })
	u.port = port
	return u
}

// holdSlow holds GET /slow until releaseSlow.
func (u *upstream) holdSlow(r *http.Request, _ *echo.Request) {
	if r.URL.Path != "/slow" {
		return
	}
	u.slowStarted <- struct{}{}
	select {
	case <-u.release:
	case <-time.After(waitTimeout):
	}
}

// releaseSlow lets held /slow requests answer.
func (u *upstream) releaseSlow() { u.releaseOnce.Do(func() { close(u.release) }) }

// requests are the request URIs the upstream answered, as received.
func (u *upstream) requests() []string {
	var out []string
	for _, r := range u.Requests() {
		out = append(out, r.URI)
	}
	return out
}

// echoedPath is the path the echo answered in body, or "" when body is not its answer.
func echoedPath(body string) string {
	got, err := echo.Decode([]byte(body))
	if err != nil {
		return ""
	}
	return got.Path
}

// zeroSeries are series that exist from the start, with zero values, so that
// rate() and alerts see them before the first event (docs/observability.md).
var zeroSeries = []string{
	`egressd_requests_total{decision="allow",listener="sandbox",reason=""}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="not_allowlisted"}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="port_not_allowed"}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="internal_address"}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="host_mismatch"}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="plaintext_credential"}`,
	`egressd_requests_total{decision="deny",listener="sandbox",reason="bad_request"}`,
	`egressd_requests_total{decision="error",listener="sandbox",reason="credential_unavailable"}`,
	`egressd_requests_total{decision="error",listener="sandbox",reason="dns_failure"}`,
	`egressd_requests_total{decision="error",listener="sandbox",reason="upstream_unreachable"}`,
	`egressd_requests_total{decision="error",listener="sandbox",reason="upstream_tls"}`,
	`egressd_requests_total{decision="error",listener="sandbox",reason="upstream_timeout"}`,
	`egressd_config_reloads_total{result="ok"}`,
	`egressd_config_reloads_total{result="error"}`,
	`egressd_bytes_total{direction="in"}`,
	`egressd_bytes_total{direction="out"}`,
	`egressd_leaf_cache_total{result="hit"}`,
	`egressd_leaf_cache_total{result="miss"}`,
	`egressd_tunnels_active`,
	`egressd_request_duration_seconds_count{listener="sandbox"}`,
}

// TestRunServes: an allowed request reaches the upstream, a denied one gets the 403
// with its reason, each leaves one complete log line, and the admin listener
// reports health, readiness, metrics and explanations.
func TestRunServes(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))

	d.waitListenerMetrics()
	for _, s := range zeroSeries {
		if v := d.metric(s); v != 0 {
			t.Errorf("before any traffic %s = %v, want 0", s, v)
		}
	}

	c := d.proxyClient()
	target := fmt.Sprintf("http://localhost:%d/hello?token=q", up.port)
	res, body := get(t, c, target)
	if res.StatusCode != http.StatusOK || echoedPath(body) != "/hello" {
		t.Fatalf("GET %s: %d %q, want 200 from the upstream", target, res.StatusCode, body)
	}
	if got := up.requests(); len(got) != 1 || got[0] != "/hello?token=q" {
		t.Errorf("upstream received %q, want [/hello?token=q]", got)
	}
	allowed := d.waitLog("egress line of the allowed request", func(l logLine) bool {
		return l.Str("message") == "egress" && l.Str("decision") == "allow"
	})
	assertEgressLine(t, allowed, map[string]any{
		"listener": "sandbox", "role": "sandbox", "method": "GET", "scheme": "http", "host": "localhost",
		"port": float64(up.port), "path": "/hello", "decision": "allow", "reason": "", "rule": "localhost",
		"intercepted": false, "credential": "", "status": float64(http.StatusOK), "resolved_ip": "127.0.0.1",
	})
	if n := allowed.Num("bytes_out"); n < float64(len(body)) {
		t.Errorf("bytes_out = %v, want at least the body's %d bytes", n, len(body))
	}
	if !strings.HasPrefix(allowed.Str("client"), "127.0.0.1:") {
		t.Errorf("client = %q, want 127.0.0.1:port", allowed.Str("client"))
	}

	res, body = get(t, c, "http://evil.test/x?y=z")
	den := assertDenied(t, res, body, http.StatusForbidden, "not_allowlisted", "evil.test", 80)
	assertEgressLine(t, d.egressLine(den.RequestID), map[string]any{
		"listener": "sandbox", "method": "GET", "scheme": "http", "host": "evil.test", "port": float64(80),
		"path": "/x", "decision": "deny", "reason": "not_allowlisted", "rule": "", "status": float64(http.StatusForbidden),
		"resolved_ip": "",
	})

	res, body = get(t, c, "http://localhost:1/")
	den = assertDenied(t, res, body, http.StatusForbidden, "port_not_allowed", "localhost", 1)
	assertEgressLine(t, d.egressLine(den.RequestID), map[string]any{
		"decision": "deny", "reason": "port_not_allowed", "rule": "localhost", "status": float64(http.StatusForbidden),
	})

	// A denied CONNECT is accepted to say why inside TLS (tls.deny_in_tunnel auto):
	// the 200 carries the reason (internal/proxy and test/conformance go inside).
	res, _ = rawConnect(t, d.Proxy, "evil.test:443")
	if res.StatusCode != http.StatusOK || res.Header.Get("Egressd-Reason") != "not_allowlisted" {
		t.Errorf("denied CONNECT: %d, Egressd-Reason %q; want 200 not_allowlisted", res.StatusCode, res.Header.Get("Egressd-Reason"))
	}

	var health struct {
		Status       string    `json:"status"`
		ConfigHash   string    `json:"config_hash"`
		ConfigLoaded time.Time `json:"config_loaded"`
	}
	d.adminJSON("/healthz", http.StatusOK, &health)
	started := d.waitLog("egressd started", func(l logLine) bool { return l.Str("message") == "egressd started" })
	if health.Status != "ok" || health.ConfigHash == "" || health.ConfigHash != started.Str("config_hash") ||
		time.Since(health.ConfigLoaded) > time.Minute {
		t.Errorf("/healthz = %+v, want status ok, the config_hash logged at start (%s), a recent load time", health, started.Str("config_hash"))
	}
	var ready map[string]any
	d.adminJSON("/readyz", http.StatusOK, &ready)
	if ready["ready"] != true {
		t.Errorf("/readyz = %v, want \"ready\": true", ready)
	}

	for series, want := range map[string]float64{
		`egressd_requests_total{decision="allow",listener="sandbox",reason=""}`:                1,
		`egressd_requests_total{decision="deny",listener="sandbox",reason="not_allowlisted"}`:  2,
		`egressd_requests_total{decision="deny",listener="sandbox",reason="port_not_allowed"}`: 1,
		`egressd_requests_total{decision="deny",listener="sandbox",reason="internal_address"}`: 0,
		`egressd_request_duration_seconds_count{listener="sandbox"}`:                           4,
	} {
		if v := d.metric(series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}

	var ex explain.Result
	d.adminJSON("/v1/explain?url="+url.QueryEscape(target), http.StatusOK, &ex)
	if ex.Decision != "allow" || ex.Rule != "localhost" || ex.Host != "localhost" || ex.Port != uint16(up.port) {
		t.Errorf("/v1/explain %s = %+v, want allow by rule localhost", target, ex)
	}
	d.adminJSON("/v1/explain?url="+url.QueryEscape("http://evil.test/"), http.StatusOK, &ex)
	if ex.Decision != "deny" || ex.Reason != "not_allowlisted" {
		t.Errorf("/v1/explain http://evil.test/ = %+v, want deny not_allowlisted", ex)
	}
	if code, body := d.adminGet("/v1/explain"); code != http.StatusBadRequest {
		t.Errorf("/v1/explain without url: %d, want 400\n%s", code, body)
	}

	for _, l := range d.lines() {
		if strings.Contains(fmt.Sprint(l), demoToken) {
			t.Errorf("a log line holds the secret: %v", l)
		}
	}
}

// assertEgressLine checks that l has every canonical field and the given values.
func assertEgressLine(t *testing.T, l logLine, want map[string]any) {
	t.Helper()
	for _, f := range egressFields {
		if _, ok := l[f]; !ok {
			t.Errorf("egress line lacks %q: %v", f, l)
		}
	}
	for k, v := range want {
		if fmt.Sprint(l[k]) != fmt.Sprint(v) {
			t.Errorf("egress line %s = %v, want %v\n%v", k, l[k], v, l)
		}
	}
	if inj, ok := l["injected"].([]any); !ok || len(inj) != 0 {
		t.Errorf("egress line injected = %v, want []", l["injected"])
	}
	if l.Str("req_id") == "" {
		t.Errorf("egress line without req_id: %v", l)
	}
	if _, ok := l["dur_ms"].(float64); !ok {
		t.Errorf("egress line dur_ms = %v, want a number", l["dur_ms"])
	}
}

// rawConnect sends a CONNECT for authority to the proxy and reads the response.
func rawConnect(t *testing.T, proxyAddr, authority string) (*http.Response, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", proxyAddr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(waitTimeout))
	fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	res, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", authority, err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return res, "" // a tunnel: what follows is the client's to send
	}
	body, _ := io.ReadAll(res.Body)
	return res, string(body)
}

// TestRunListenerMetricsAtStart: once egressd has logged "egressd started" (and
// /readyz answers ready), the listener's zero-valued series are exported.
func TestRunListenerMetricsAtStart(t *testing.T) {
	t.Parallel()
	for range 20 {
		d := startRunner(t, runConfig(runOpts{ports: []int{80}}))
		if _, ok := d.lookupMetric(zeroSeries[0]); !ok {
			t.Fatalf("/metrics right after \"egressd started\" lacks %s", zeroSeries[0])
		}
		d.signal(syscall.SIGTERM)
		d.waitExit(waitTimeout)
	}
}

// TestRunSignalRightAfterStart: a SIGHUP or SIGTERM that arrives as soon as egressd
// has logged "egressd started" reloads or drains; it does not kill the process.
func TestRunSignalRightAfterStart(t *testing.T) {
	t.Parallel()
	for range 20 {
		d := startRunner(t, runConfig(runOpts{ports: []int{80}}))
		if err := d.SignalNow(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		d.waitLog("config reloaded", func(l logLine) bool { return l.Str("message") == "config reloaded" })
		if err := d.SignalNow(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := d.waitExit(waitTimeout); code != 0 {
			t.Fatalf("SIGTERM right after a reload: exit %d, want 0", code)
		}
	}
}

// TestRunTunnel: an allowed CONNECT is spliced end to end (the client verifies the
// upstream's own certificate) and logged once, at close, with its byte counts.
func TestRunTunnel(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t)
	cert := ca.Leaf(t, "localhost")
	up := startUpstream(t, &cert)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))

	c := d.proxyClient()
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: ca.Pool}
	target := fmt.Sprintf("https://localhost:%d/tls", up.port)
	res, body := get(t, c, target)
	if res.StatusCode != http.StatusOK || echoedPath(body) != "/tls" {
		t.Fatalf("GET %s: %d %q, want 200 from the upstream", target, res.StatusCode, body)
	}
	c.CloseIdleConnections() // ends the tunnel, which logs at close
	l := d.waitLog("egress line of the tunnel", func(l logLine) bool {
		return l.Str("message") == "egress" && l.Str("method") == "CONNECT"
	})
	assertEgressLine(t, l, map[string]any{
		"host": "localhost", "port": float64(up.port), "decision": "allow", "reason": "", "rule": "localhost",
		"intercepted": false, "resolved_ip": "127.0.0.1",
	})
	if l.Num("bytes_in") == 0 || l.Num("bytes_out") == 0 {
		t.Errorf("tunnel line bytes_in %v, bytes_out %v; want both counted", l["bytes_in"], l["bytes_out"])
	}
}

// freePorts returns n ports on 127.0.0.1 that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := egressdtest.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// TestRunNeverReachesItself: even with loopback opened and both of egressd's own
// ports on the allowlist, a request to its listener or admin address is refused
// as internal_address (self), before and after a reload.
func TestRunNeverReachesItself(t *testing.T) {
	t.Parallel()
	ports := freePorts(t, 2)
	lport, aport := ports[0], ports[1]
	cfg := runOpts{
		listener: fmt.Sprintf("127.0.0.1:%d", lport), admin: fmt.Sprintf("127.0.0.1:%d", aport),
		ports: []int{lport, aport},
	}
	d := startRunner(t, runConfig(cfg))
	check := func(when string) {
		t.Helper()
		c := d.proxyClient()
		for _, p := range []int{lport, aport} {
			res, body := get(t, c, fmt.Sprintf("http://localhost:%d/healthz", p))
			den := assertDenied(t, res, body, http.StatusForbidden, "internal_address", "localhost", p)
			if den.Detail != "self" {
				t.Errorf("%s: request to own port %d: detail %q, want self", when, p, den.Detail)
			}
		}
	}
	check("at start")
	cfg.extra = "limits: {dial: 5s}\n" // a different config, so the reload is a real one
	d.rewriteConfig(runConfig(cfg))
	d.signal(syscall.SIGHUP)
	d.waitLog("config reloaded", func(l logLine) bool { return l.Str("message") == "config reloaded" })
	check("after a reload")
}

// TestRunReload: SIGHUP with an invalid config keeps the running one in force; with a
// valid one it swaps the policy for the next request, and /healthz and the
// metrics show it.
func TestRunReload(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))
	c := d.proxyClient()
	target := fmt.Sprintf("http://localhost:%d/reload", up.port)
	if res, body := get(t, c, target); res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s before any reload: %d %s", target, res.StatusCode, body)
	}
	hash0 := d.configHash()

	// An invalid config is rejected; the old policy stays in force.
	d.rewriteConfig(runConfig(runOpts{ports: []int{up.port}, extra: "limits: {dial: forever}\n"}))
	d.signal(syscall.SIGHUP)
	rejected := d.waitLog("reload rejected", func(l logLine) bool {
		return strings.HasPrefix(l.Str("message"), "reload rejected")
	})
	if l := rejected.Str("level"); l != "error" || !strings.Contains(rejected.Str("error"), "limits.dial") {
		t.Errorf("reload rejected line: level %q, error %q; want error naming limits.dial", l, rejected.Str("error"))
	}
	if res, body := get(t, c, target); res.StatusCode != http.StatusOK {
		t.Errorf("GET %s after a rejected reload: %d %s, want 200 (the old policy)", target, res.StatusCode, body)
	}
	if h := d.configHash(); h != hash0 {
		t.Errorf("config_hash after a rejected reload = %s, want %s", h, hash0)
	}
	assertReloads(t, d, 0, 1)

	// A valid config that no longer allows localhost.
	d.rewriteConfig(runConfig(runOpts{allow: "other.test", ports: []int{up.port}}))
	d.signal(syscall.SIGHUP)
	reloaded := d.waitLog("config reloaded", func(l logLine) bool { return l.Str("message") == "config reloaded" })
	res, body := get(t, c, target) // on the same keep-alive connection, if the client kept one
	assertDenied(t, res, body, http.StatusForbidden, "not_allowlisted", "localhost", up.port)
	res, body = get(t, d.proxyClient(), target) // and on a new one
	assertDenied(t, res, body, http.StatusForbidden, "not_allowlisted", "localhost", up.port)
	hash1 := d.configHash()
	if hash1 == hash0 || hash1 != reloaded.Str("config_hash") {
		t.Errorf("config_hash after the reload = %s; want new (not %s) and as logged (%s)", hash1, hash0, reloaded.Str("config_hash"))
	}
	assertReloads(t, d, 1, 1)
	var ex explain.Result
	d.adminJSON("/v1/explain?url="+url.QueryEscape(target), http.StatusOK, &ex)
	if ex.Decision != "deny" || ex.Reason != "not_allowlisted" {
		t.Errorf("/v1/explain after the reload = %+v, want deny not_allowlisted", ex)
	}

	// A rejected reload never fails open: the policy that denies localhost stays.
	d.rewriteConfig(runConfig(runOpts{ports: []int{up.port}, extra: "limits: {dial: forever}\n"}))
	d.signal(syscall.SIGHUP)
	d.waitNth("a second reload rejected", 2, func(l logLine) bool {
		return strings.HasPrefix(l.Str("message"), "reload rejected")
	})
	assertReloads(t, d, 1, 2)
	res, body = get(t, c, target)
	assertDenied(t, res, body, http.StatusForbidden, "not_allowlisted", "localhost", up.port)
	if h := d.configHash(); h != hash1 {
		t.Errorf("config_hash after a rejected reload = %s, want %s", h, hash1)
	}
	if n := len(up.requests()); n != 2 {
		t.Errorf("upstream received %d requests, want 2 (none after the policy denied localhost)", n)
	}
}

func assertReloads(t *testing.T, d *runner, ok, failed float64) {
	t.Helper()
	if v := d.metric(`egressd_config_reloads_total{result="ok"}`); v != ok {
		t.Errorf(`config_reloads_total{result="ok"} = %v, want %v`, v, ok)
	}
	if v := d.metric(`egressd_config_reloads_total{result="error"}`); v != failed {
		t.Errorf(`config_reloads_total{result="error"} = %v, want %v`, v, failed)
	}
}

// TestRunDrain: SIGTERM stops accepting at once, lets the request in flight (held
// 500 ms by the upstream) finish with its 200, and exits 0.
func TestRunDrain(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))

	type outcome struct {
		code int
		body string
		err  error
	}
	done := make(chan outcome, 1)
	start := time.Now()
	go func() {
		res, err := d.proxyClient().Get(fmt.Sprintf("http://localhost:%d/slow", up.port))
		if err != nil {
			done <- outcome{err: err}
			return
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		done <- outcome{res.StatusCode, string(body), err}
	}()
	select {
	case <-up.slowStarted:
	case <-time.After(waitTimeout):
		t.Fatal("the slow request never reached the upstream")
	}

	d.signal(syscall.SIGTERM)
	d.waitLog("draining", func(l logLine) bool { return l.Str("message") == "draining" })
	refusedAt := waitRefused(t, d.Proxy)
	select {
	case o := <-done:
		t.Fatalf("the request in flight ended before the upstream answered: %+v", o)
	default:
	}
	t.Logf("new connections refused %v after the request started", refusedAt.Sub(start).Round(time.Millisecond))

	time.Sleep(time.Until(start.Add(500 * time.Millisecond)))
	up.releaseSlow()
	select {
	case o := <-done:
		if o.err != nil || o.code != http.StatusOK || echoedPath(o.body) != "/slow" {
			t.Errorf("request in flight during SIGTERM: %+v, want 200 from the upstream", o)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the request in flight did not complete")
	}
	if code := d.waitExit(5 * time.Second); code != 0 {
		t.Errorf("egressd exited %d after SIGTERM, want 0", code)
	}
	d.waitLog("egressd stopped", func(l logLine) bool { return l.Str("message") == "egressd stopped" })
	if _, err := net.DialTimeout("tcp", d.Proxy, time.Second); err == nil {
		t.Error("the proxy address accepts connections after egressd exited")
	}
}

// waitRefused waits until a connection to addr is refused and returns when.
func waitRefused(t *testing.T, addr string) time.Time {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return time.Now()
		}
		if err == nil {
			nc.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections to %s still not refused %v after SIGTERM (last: %v)", addr, waitTimeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunAddressInUse: a listener or admin address that cannot be bound is a runtime
// failure, exit 2, with the cause logged.
func TestRunAddressInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, o := range []runOpts{
		{listener: busy.Addr().String(), ports: []int{80}},
		{admin: busy.Addr().String(), ports: []int{80}},
	} {
		dir := writeFiles(t, map[string]string{"egressd.yaml": runConfig(o), "credentials.json": "{}"})
		res := egressd(t, "run", "--config", filepath.Join(dir, "egressd.yaml"))
		if res.code != 2 {
			t.Errorf("run with %s in use: %s\nwant exit 2", busy.Addr(), res)
		}
		var failed logLine
		for _, l := range parseLines(strings.Split(res.stdout, "\n")) {
			if l.Str("message") == "egressd failed to start" {
				failed = l
			}
		}
		if failed == nil || !strings.Contains(failed.Str("error"), "address already in use") || failed.Str("level") != "error" {
			t.Errorf("run with %s in use: no error line \"egressd failed to start\" naming the cause\n%s", busy.Addr(), res)
		}
	}
}

func TestRunInvalidConfig(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{"egressd.yaml": badConfig})
	res := egressd(t, "run", "--config", filepath.Join(dir, "egressd.yaml"))
	if res.code != 1 {
		t.Errorf("run with an invalid config: %s\nwant exit 1", res)
	}
	for _, want := range badConfigProblems {
		if !strings.Contains(res.stderr, want.path) {
			t.Errorf("run with an invalid config: stderr lacks %s\n%s", want.path, res)
		}
	}
}

// TestRunListenErrorNamesTheListener: a port already in use (`make run` still
// running) names the listener, the config key of its address and the likely cause.
func TestRunListenErrorNamesTheListener(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	dir := writeFiles(t, map[string]string{"credentials.json": "{}",
		"egressd.yaml": runConfig(runOpts{listener: held.Addr().String(), ports: []int{80}})})
	cfg := filepath.Join(dir, "egressd.yaml")
	res := egressd(t, "run", "--config", cfg)
	for _, want := range []string{`listener \"sandbox\" (listeners[0].address)`, "address already in use",
		"another process holds the port", "change listeners[0].address in " + cfg} {
		if !strings.Contains(res.all(), want) {
			t.Errorf("run with its port taken lacks %q:\n%s", want, res)
		}
	}
	if res.code != exitRuntime {
		t.Errorf("exit %d, want %d", res.code, exitRuntime)
	}
}

// TestConsoleLogWithoutTerminal: log.format console writes no ANSI colours when
// stderr is not a terminal (a file, a pipe, a container's log).
func TestConsoleLogWithoutTerminal(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	cfg := strings.Replace(runConfig(runOpts{listener: held.Addr().String(), ports: []int{80}}),
		"format: json", "format: console", 1)
	dir := writeFiles(t, map[string]string{"credentials.json": "{}", "egressd.yaml": cfg})
	res := egressd(t, "run", "--config", filepath.Join(dir, "egressd.yaml"))
	if !strings.Contains(res.stderr, "egressd failed to start") || strings.Contains(res.stderr, "\x1b[") {
		t.Errorf("console log to a pipe: %q; want the line without ANSI escapes", res.stderr)
	}
}

// TestQuickstartFromAnyDirectory: without --config the quick-start defaults work
// outside the repository: the embedded policy and credentials are written to the
// state dir (0600) and used.
func TestQuickstartFromAnyDirectory(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"check"}, {"explain", "https://api.github.com/"}} {
		cmd := exec.Command(binary(), args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), map[string]string{"check": "ok", "explain": "decision:   allow"}[args[0]]) {
			t.Errorf("egressd %v in %s: %v\n%s", args, dir, err, out)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, ".egressd/quickstart/credentials.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("quick-start credentials: %v, mode %v; want 0600", err, fi)
	}
}
