package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/testpki"
	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// End-to-end tests of Vault-backed credentials through `egressd run`: each test starts a
// Vault dev server of its own (the binary `scripts/vaultdev.sh build` prints, run
// directly, so that sealing it disturbs no other test), configures it through its HTTP
// API with the root token (a policy, an AppRole role, a KV v2 secret), and starts egressd
// with credentials.backend vault and AppRole login. An allowlist entry for vaultHost
// names the credential, so egressd intercepts the tunnel and injects Authorization; the
// upstream is an HTTPS server on 127.0.0.1 that records the header of every request it
// receives. The name resolves through a DNS stub on 127.0.0.1 (network.resolver), so no
// DNS query leaves the machine; every address is loopback.
//
// The measured figures are logged in a fixed format ("rotation: ...", "outage: ...",
// "deleted: ...", "wrong shape: ...") to be quoted. Without the vaultdev binary (no Go
// toolchain to build it, or -short) the tests skip, unless EGRESSD_REQUIRE_VAULT=1, when
// they fail. A cold build of the binary takes about 5 minutes; `make test` builds it
// first (make deps), after which `scripts/vaultdev.sh build` answers in milliseconds.

const (
	vaultHost   = "api.vault-e2e.test" // the allowlisted name, answered by the DNS stub
	vaultCredID = "api"                // the credential ID: KV secret/data/egressd/credentials/api
	vaultPolicy = "egressd-e2e"
	vaultRole   = "egressd-e2e"

	vaultRefresh  = time.Second     // credentials.vault.refresh
	vaultMaxStale = 3 * time.Second // credentials.max_stale of the load tests
	// refreshSlack is what the tests allow beyond refresh+jitter for a change in Vault
	// to show through egressd: the read itself, and scheduling on a loaded 2-CPU
	// machine under -race, where this process was seen to stall for up to a second.
	refreshSlack = 2 * time.Second
	// loadClients is how many clients send requests back to back through egressd.
	loadClients = 8
	// maxRequestsPerLoadClient bounds each client's loop by count as well as time.
	maxRequestsPerLoadClient = 100_000
	// clockSlack absorbs the gap between this process's clock readings and egressd's
	// (one clock, two processes).
	clockSlack = 5 * time.Millisecond
)

// vaultdevBin caches the result of `scripts/vaultdev.sh build` for the package.
var vaultdevBin struct {
	once sync.Once
	path string
	err  error
}

// vaultdevBinary returns the path of the Vault dev server binary, building it with
// scripts/vaultdev.sh when it is not cached. It skips the test (fails it under
// EGRESSD_REQUIRE_VAULT=1) when there is none.
func vaultdevBinary(t *testing.T) string {
	t.Helper()
	require := os.Getenv("EGRESSD_REQUIRE_VAULT") == "1"
	if testing.Short() && !require {
		t.Skip("-short: skipping the end-to-end Vault test (it starts a Vault dev server and runs load for seconds)")
	}
	vaultdevBin.once.Do(func() {
		script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "vaultdev.sh"))
		if err != nil {
			vaultdevBin.err = err
			return
		}
		if _, err := os.Stat(script); err != nil {
			vaultdevBin.err = fmt.Errorf("no build script: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		path, err := vaultdev.Build(ctx, script)
		if err != nil {
			vaultdevBin.err = err
			return
		}
		vaultdevBin.path = path
	})
	if vaultdevBin.err != nil {
		if require {
			t.Fatalf("EGRESSD_REQUIRE_VAULT=1 but there is no Vault dev server binary: %v", vaultdevBin.err)
		}
		t.Skipf("no Vault dev server binary, skipping the end-to-end Vault test (EGRESSD_REQUIRE_VAULT=1 makes this a failure): %v", vaultdevBin.err)
	}
	return vaultdevBin.path
}

func lastChars(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// vaultServer is one Vault dev server (internal/testutil/vaultdev), the test's own,
// and a root client for it.
type vaultServer struct {
	*vaultdev.Server
	t                          *testing.T
	addr, rootToken, unsealKey string
	hc                         *http.Client
}

// startVault runs the vaultdev binary on 127.0.0.1:0 and waits for its ready file. The
// server is killed when the test ends (and, should the test binary die, by Pdeathsig).
func startVault(t *testing.T) *vaultServer {
	t.Helper()
	bin := vaultdevBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := vaultdev.Start(ctx, bin, t.TempDir(), "error")
	if err != nil {
		t.Fatal(err)
	}
	v := &vaultServer{Server: srv, t: t, addr: srv.Addr, rootToken: srv.RootToken, unsealKey: srv.UnsealKey,
		hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}}
	t.Cleanup(func() {
		v.Stop()
		v.hc.CloseIdleConnections()
		if t.Failed() {
			t.Logf("vault stderr:\n%s", v.Log(4000))
		}
	})
	return v
}

// call sends one request to Vault's HTTP API with the root token and returns the status
// and the decoded JSON body (nil when there is none).
func (v *vaultServer) call(method, path string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, v.addr+"/v1/"+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Vault-Token", v.rootToken)
	res, err := v.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, nil, err
	}
	var out map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			return res.StatusCode, nil, fmt.Errorf("%s %s: not JSON: %v: %q", method, path, err, lastChars(string(raw), 300))
		}
	}
	return res.StatusCode, out, nil
}

// must is call that fails the test unless Vault answers 200 or 204.
func (v *vaultServer) must(method, path string, body any) map[string]any {
	v.t.Helper()
	code, out, err := v.call(method, path, body)
	if err != nil || (code != http.StatusOK && code != http.StatusNoContent) {
		v.t.Fatalf("vault %s %s: %d %v %v", method, path, code, out["errors"], err)
	}
	return out
}

func dataField(out map[string]any, key string) any {
	d, _ := out["data"].(map[string]any)
	return d[key]
}

// appRole creates a policy that may read every egressd credential and an AppRole role
// with it (renewable tokens of tokenTTL), and returns files holding its role ID and a new
// secret ID.
func (v *vaultServer) appRole(tokenTTL string) (roleIDFile, secretIDFile string) {
	v.t.Helper()
	v.must("PUT", "sys/policies/acl/"+vaultPolicy, map[string]any{
		"policy": `path "secret/data/egressd/credentials/*" { capabilities = ["read"] }`,
	})
	role := "auth/approle/role/" + vaultRole
	v.must("POST", role, map[string]any{
		"token_policies": []string{vaultPolicy}, "token_ttl": tokenTTL, "token_max_ttl": "1h",
	})
	roleID, _ := dataField(v.must("GET", role+"/role-id", nil), "role_id").(string)
	secretID, _ := dataField(v.must("POST", role+"/secret-id", nil), "secret_id").(string)
	if roleID == "" || secretID == "" {
		v.t.Fatal("vault returned no role_id or secret_id")
	}
	dir := v.t.TempDir()
	roleIDFile, secretIDFile = filepath.Join(dir, "role-id"), filepath.Join(dir, "secret-id")
	for f, s := range map[string]string{roleIDFile: roleID, secretIDFile: secretID} {
		if err := os.WriteFile(f, []byte(s+"\n"), 0o600); err != nil {
			v.t.Fatal(err)
		}
	}
	return roleIDFile, secretIDFile
}

// kvPath is the KV v2 data path of credential id.
func kvPath(id string) string { return "secret/data/egressd/credentials/" + id }

// putKV writes a new version of credential id and returns its version number.
func (v *vaultServer) putKV(id string, data map[string]any) int {
	v.t.Helper()
	out := v.must("POST", kvPath(id), map[string]any{"data": data})
	n, _ := dataField(out, "version").(float64)
	return int(n)
}

// seal seals Vault: from then on it answers every request with 503.
func (v *vaultServer) seal() {
	v.t.Helper()
	v.must("PUT", "sys/seal", nil)
}

// unseal unseals Vault with its one key share; data and tokens are intact.
func (v *vaultServer) unseal() {
	v.t.Helper()
	out := v.must("PUT", "sys/unseal", map[string]any{"key": v.unsealKey})
	if sealed, _ := out["sealed"].(bool); sealed {
		v.t.Fatalf("vault still sealed after sys/unseal: %v", out)
	}
}

// seenRequest is one request the upstream received.
type seenRequest struct {
	at   time.Time
	auth []string // every Authorization header value
}

// recordingUpstream is the echo (internal/testutil/echo), HTTPS on 127.0.0.1 with a
// leaf for vaultHost, that answers 200 "ok" (never the credential back) and records
// the Authorization of every request, in arrival order.
type recordingUpstream struct {
	*echo.Server
	port   int
	caFile string // the PEM of the CA that signed its leaf: egressd's tls.upstream_ca_file
}

func startRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	ca := testpki.New(t)
	u := &recordingUpstream{caFile: filepath.Join(t.TempDir(), "upstream-ca.pem")}
	if err := os.WriteFile(u.caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	u.Server = &echo.Server{HTTP1Only: true, Route: func(w http.ResponseWriter, r *http.Request) bool {
		u.Record(u.Read(r))
		io.WriteString(w, "ok")
		return true
	}}
	leaf := ca.Leaf(t, vaultHost)
	port, err := u.Listen("127.0.0.1:0", &leaf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	u.port = port
	return u
}

func (u *recordingUpstream) requests() []seenRequest {
	var out []seenRequest
	for _, r := range u.Requests() {
		out = append(out, seenRequest{at: r.At, auth: r.Header.Values("Authorization")})
	}
	return out
}

// vaultE2E is one test's world: its Vault, upstream, DNS stub and egressd.
type vaultE2E struct {
	t     *testing.T
	vault *vaultServer
	up    *recordingUpstream
	d     *runner
	roots *x509.CertPool // egressd's interception CA
	url   string         // https://vaultHost:port/
	v1    string         // the token of the KV version written before egressd started

	mu      sync.Mutex
	secrets []string // every value written to Vault
}

// startVaultE2E starts Vault (AppRole with 20 s renewable tokens; version 1 of the
// credential written), the upstream, the DNS stub and egressd, and checks that one
// request through egressd reaches the upstream with version 1.
func startVaultE2E(t *testing.T, maxStale time.Duration) *vaultE2E {
	t.Helper()
	e := &vaultE2E{t: t, vault: startVault(t), up: startRecordingUpstream(t)}
	roleIDFile, secretIDFile := e.vault.appRole("20s")
	e.v1 = e.newSecret("v1-")
	if n := e.vault.putKV(vaultCredID, map[string]any{"token": e.v1}); n != 1 {
		t.Fatalf("first KV write made version %d, want 1", n)
	}
	dns := dnsstub.Start(t)
	dns.Set(vaultHost, "A 127.0.0.1")
	cfg := fmt.Sprintf(`version: 1
environment: env_vault_e2e
listeners:
  - {name: sandbox, address: "127.0.0.1:0", mode: proxy, role: sandbox}
admin: {address: "127.0.0.1:0"}
readiness: {require_credentials: true} # the outage tests read /readyz's 503
policy:
  allowlist:
    - {domain: %s, ports: [%d], credential: %s}
network:
  resolver: %q
  unsafe_allow_cidrs: [127.0.0.0/8]
tls:
  intercept: auto
  upstream_ca_file: %q
credentials:
  backend: vault
  max_stale: %s
  vault:
    address: %q
    auth: {method: approle, role_id_file: %q, secret_id_file: %q}
    refresh: %s
log: {level: info, format: json}
state_dir: state
`, vaultHost, e.up.port, vaultCredID, dns.Addr, e.up.caFile, maxStale, e.vault.addr, roleIDFile, secretIDFile, vaultRefresh)
	e.d = startFileLoggedRunner(t, cfg)
	code, pem := e.d.adminGet("/ca.pem")
	e.roots = x509.NewCertPool()
	if code != http.StatusOK || !e.roots.AppendCertsFromPEM([]byte(pem)) {
		t.Fatalf("egressd /ca.pem: %d, no certificate", code)
	}
	e.url = fmt.Sprintf("https://%s:%d/", vaultHost, e.up.port)
	if r := e.once(); r.status != http.StatusOK {
		t.Fatalf("first request through egressd: %+v", r)
	}
	if seen := e.up.requests(); len(seen) != 1 || !slices.Equal(seen[0].auth, []string{"Bearer " + e.v1}) {
		t.Fatalf("upstream saw %d requests, the first with Authorization %q; want 1 with version 1", len(seen), authOf(seen))
	}
	t.Cleanup(func() { e.checkLogsHoldNoSecret() })
	return e
}

// startFileLoggedRunner is startRunner without the credentials file. Like every
// egressdtest run, egressd's stdout is a file, not a pipe this process drains:
// under load egressd logs a line per request, megabytes a second, and through a
// pipe a stall of this process (seen up to a second under -race on a busy 2-CPU
// machine) would stall egressd's logging, and with it its request path and its
// credential refresh loop, which would measure the test rather than egressd. On
// failure only the lines that are not per-request "egress" lines are shown, and
// the last few of those (egressdtest.Egressd.Summary).
func startFileLoggedRunner(t *testing.T, cfg string) *runner {
	t.Helper()
	return startRunnerWith(t, cfg, nil)
}

// newSecret returns prefix and a random part, a value to write to Vault, and remembers
// it: egressd must never log it.
func (e *vaultE2E) newSecret(prefix string) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		e.t.Fatal(err)
	}
	s := prefix + hex.EncodeToString(b)
	e.mu.Lock()
	e.secrets = append(e.secrets, s)
	e.mu.Unlock()
	return s
}

func authOf(seen []seenRequest) [][]string {
	out := make([][]string, len(seen))
	for i, s := range seen {
		out[i] = s.auth
	}
	return out
}

// client is one load client: its own transport, and so its own tunnel through egressd.
func (e *vaultE2E) client() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:               http.ProxyURL(&url.URL{Scheme: "http", Host: e.d.Proxy}),
			TLSClientConfig:     &tls.Config{RootCAs: e.roots},
			MaxIdleConnsPerHost: 1,
		},
		Timeout: 5 * time.Second,
	}
}

// reqResult is one request through egressd, as the client saw it.
type reqResult struct {
	start, end time.Time
	status     int    // 0: transport error
	reason     string // Egressd-Reason
	detail     string // the refusal body's detail
	err        string
}

func (r reqResult) ok() bool { return r.status == http.StatusOK && r.err == "" }

func fetchOnce(c *http.Client, target string) reqResult {
	r := reqResult{start: time.Now()}
	defer func() { r.end = time.Now() }()
	res, err := c.Get(target)
	if err != nil {
		r.err, r.end = err.Error(), time.Now()
		return r
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	r.end = time.Now()
	r.status, r.reason = res.StatusCode, res.Header.Get("Egressd-Reason")
	if err != nil {
		r.err = err.Error()
	}
	if r.status != http.StatusOK {
		var den denial
		if json.Unmarshal(body, &den) == nil {
			r.detail = den.Detail
		}
	}
	return r
}

// once sends one request on a fresh client.
func (e *vaultE2E) once() reqResult {
	c := e.client()
	defer c.CloseIdleConnections()
	return fetchOnce(c, e.url)
}

// loadRun is loadClients clients sending requests back to back through egressd until
// stopped or for at most its bound.
type loadRun struct {
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []reqResult
}

func (e *vaultE2E) startLoad(bound time.Duration) *loadRun {
	l := &loadRun{stop: make(chan struct{})}
	e.t.Cleanup(func() { l.finish() }) // should the test end early
	deadline := time.Now().Add(bound)
	for range loadClients {
		c := e.client()
		l.wg.Go(func() {
			defer c.CloseIdleConnections()
			for n := 0; n < maxRequestsPerLoadClient && time.Now().Before(deadline); n++ {
				select {
				case <-l.stop:
					return
				default:
				}
				r := fetchOnce(c, e.url)
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
				if !r.ok() {
					time.Sleep(5 * time.Millisecond) // a refusal is cheap: no busy loop
				}
			}
		})
	}
	return l
}

// finish stops the clients, waits for their last requests and returns every result,
// ordered by start.
func (l *loadRun) finish() []reqResult {
	l.stopped.Do(func() { close(l.stop) })
	return l.wait()
}

// wait waits for the clients to reach the load's bound and returns every result, ordered
// by start.
func (l *loadRun) wait() []reqResult {
	l.wg.Wait()
	out := l.snapshot()
	slices.SortFunc(out, func(a, b reqResult) int { return a.start.Compare(b.start) })
	return out
}

func (l *loadRun) snapshot() []reqResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results)
}

// waitFor polls the results until one that started at or after from satisfies match,
// and returns it; it fails the test after within.
func (l *loadRun) waitFor(t *testing.T, desc string, from time.Time, within time.Duration, match func(reqResult) bool) reqResult {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, r := range l.snapshot() {
			if !r.start.Before(from) && match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			l.finish()
			t.Fatalf("no %s within %v", desc, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readyPoll is one GET /readyz.
type readyPoll struct {
	sent, at time.Time // when the request was sent and the response read
	code     int
	ready    bool
	credOK   bool    // credentials.api.ready
	version  string  // credentials.api.version
	age      float64 // credentials.api.age_seconds
	credErr  string  // credentials.api.error
	fetchErr string
}

// lastGood bounds when the last good read of the credential started, by egressd's
// account: egressd took its age at some moment between sending and receiving, rounded
// to the millisecond.
func (p readyPoll) lastGood() (earliest, latest time.Time) {
	age := time.Duration(p.age * float64(time.Second))
	return p.sent.Add(-age - time.Millisecond), p.at.Add(-age + time.Millisecond)
}

func pollReady(c *http.Client, admin string) readyPoll {
	p := readyPoll{sent: time.Now()}
	res, err := c.Get("http://" + admin + "/readyz")
	if err != nil {
		p.at, p.fetchErr = time.Now(), err.Error()
		return p
	}
	defer res.Body.Close()
	var body struct {
		Ready       bool `json:"ready"`
		Credentials map[string]struct {
			Ready      bool    `json:"ready"`
			Version    string  `json:"version"`
			AgeSeconds float64 `json:"age_seconds"`
			Error      string  `json:"error"`
		} `json:"credentials"`
	}
	err = json.NewDecoder(res.Body).Decode(&body)
	p.at, p.code = time.Now(), res.StatusCode
	if err != nil {
		p.fetchErr = err.Error()
		return p
	}
	c0 := body.Credentials[vaultCredID]
	p.ready, p.credOK, p.version, p.age, p.credErr = body.Ready, c0.Ready, c0.Version, c0.AgeSeconds, c0.Error
	return p
}

// readyPoller polls /readyz every 100 ms until stopped.
type readyPoller struct {
	stopped sync.Once
	stop    chan struct{}
	done    chan struct{}
	polls   []readyPoll
}

func (e *vaultE2E) startReadyPoller() *readyPoller {
	p := &readyPoller{stop: make(chan struct{}), done: make(chan struct{})}
	e.t.Cleanup(func() { p.finish() })
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	go func() {
		defer close(p.done)
		defer c.CloseIdleConnections()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for range 600 { // at most a minute
			p.polls = append(p.polls, pollReady(c, e.d.Admin))
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *readyPoller) finish() []readyPoll {
	p.stopped.Do(func() { close(p.stop) })
	<-p.done
	return p.polls
}

// checkLogsHoldNoSecret: no line egressd wrote, on stdout or stderr, holds a value the
// test wrote to Vault.
func (e *vaultE2E) checkLogsHoldNoSecret() {
	all := string(e.d.LogBytes()) + string(e.d.Stderr())
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.secrets {
		if strings.Contains(all, s) {
			e.t.Errorf("egressd logged a value the test wrote to Vault (%s…)", s[:3])
		}
	}
}

// tally counts results.
func tally(rs []reqResult) (ok, failed int, kinds map[string]int) {
	kinds = map[string]int{}
	for _, r := range rs {
		if r.ok() {
			ok++
			continue
		}
		failed++
		k := r.err
		if k == "" {
			k = fmt.Sprintf("%d %s %s", r.status, r.reason, r.detail)
		}
		kinds[k]++
	}
	return ok, failed, kinds
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// TestVaultE2ERotationUnderLoad: 8 clients send requests back to back through egressd;
// 2 s in, version 2 of the credential is written to Vault. The upstream sees version 2
// within refresh (+jitter, +slack), no request fails during the swap, and every request
// it receives carries exactly one Authorization, of version 1 or 2. When version 2 first
// shows depends on where the write falls in egressd's refresh cycle: anywhere from 0 to
// refresh (+10% jitter). Not parallel, nor is TestVaultE2EOutage: under load, each would
// measure the other.
func TestVaultE2ERotationUnderLoad(t *testing.T) {
	e := startVaultE2E(t, vaultMaxStale)
	before := len(e.up.requests())
	const bound = 8 * time.Second
	l := e.startLoad(bound)
	time.Sleep(2 * time.Second)
	v2 := e.newSecret("v2-")
	if n := e.vault.putKV(vaultCredID, map[string]any{"token": v2}); n != 2 {
		t.Fatalf("second KV write made version %d, want 2", n)
	}
	written := time.Now()
	results := l.wait() // until the bound: 6 s after the write

	seen := e.up.requests()[before:]
	want1, want2 := "Bearer "+e.v1, "Bearer "+v2
	var firstV2, lastV1 time.Time
	var bad, v1AfterV2 int
	for _, s := range seen {
		switch {
		case len(s.auth) == 1 && s.auth[0] == want1:
			lastV1 = s.at
			if !firstV2.IsZero() {
				v1AfterV2++
			}
		case len(s.auth) == 1 && s.auth[0] == want2:
			if firstV2.IsZero() {
				firstV2 = s.at
			}
		default:
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("the upstream saw %d requests without exactly one Authorization of version 1 or 2", bad)
	}
	if firstV2.IsZero() {
		t.Fatalf("the upstream never saw version 2 (%d requests over %v, the write at +2s)", len(seen), bound)
	}
	onlyV2 := firstV2
	if lastV1.After(onlyV2) {
		onlyV2 = lastV1
	}
	ok, failed, kinds := tally(results)
	var swapFailed int
	for _, r := range results {
		if !r.ok() && r.end.After(written.Add(-vaultRefresh)) && r.start.Before(onlyV2.Add(vaultRefresh)) {
			swapFailed++
		}
	}
	t.Logf("rotation: first v2 after %s, only v2 after %s, %d v1 after the first v2, %d failed of %d (%d failed during the swap), refresh %v, %d clients",
		secs(firstV2.Sub(written)), secs(onlyV2.Sub(written)), v1AfterV2, failed, len(results), swapFailed, vaultRefresh, loadClients)
	if failed > 0 {
		t.Errorf("%d of %d requests failed: %v", failed, len(results), kinds)
	}
	if limit := time.Duration(float64(vaultRefresh)*1.1) + refreshSlack; firstV2.Sub(written) > limit {
		t.Errorf("version 2 reached the upstream %v after the write, want within refresh+jitter+slack %v", firstV2.Sub(written), limit)
	}
	if failed == 0 && ok != len(seen) {
		t.Errorf("%d requests succeeded, the upstream saw %d", ok, len(seen))
	}
	if !firstV2.After(written) {
		t.Errorf("version 2 reached the upstream before it was written")
	}
	rotated := e.d.waitLog("credential rotated", func(l logLine) bool { return l.Str("message") == "credential rotated" })
	if rotated.Str("credential") != vaultCredID || rotated.Str("version") != "2" || rotated.Str("previous_version") != "1" {
		t.Errorf("rotation line: %v, want credential %s, version 2, previous_version 1", rotated, vaultCredID)
	}
}

// errorSeries counts the credential's failed reads.
const errorSeries = `egressd_credential_refresh_total{credential="api",result="error"}`

// waitMetric polls series on /metrics every 50 ms until ok accepts its value, and
// returns when; it fails the test after within.
func waitMetric(t *testing.T, d *runner, series string, within time.Duration, ok func(float64) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if v, found := d.lookupMetric(series); found && ok(v) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach the expected value within %v", series, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVaultE2EOutage: under the same load, Vault is sealed (every request to it gets 503).
// egressd keeps serving the last good value until max_stale after the last good read,
// then answers 503 credential_unavailable; the upstream never sees a request without the
// credential; /readyz turns not ready. Vault is unsealed: requests succeed again without
// a restart and /readyz is ready again.
func TestVaultE2EOutage(t *testing.T) {
	e := startVaultE2E(t, vaultMaxStale)
	before := len(e.up.requests())
	l := e.startLoad(30 * time.Second)
	rp := e.startReadyPoller()
	time.Sleep(2 * time.Second)
	e.vault.seal()
	sealed := time.Now()

	// Until max_stale after the last good read the last good value is served; then 503.
	first503 := l.waitFor(t, "503 after the seal", sealed, vaultMaxStale+3*time.Second, func(r reqResult) bool {
		return r.status == http.StatusServiceUnavailable
	})
	// Keep Vault sealed until egressd has counted a failed read (its Vault client retries a
	// 503 twice, 1-1.5 s and 2-3 s later, so a read takes 3-4.5 s to fail) and for at
	// least 1.5 s of 503s, long enough for /readyz and the clients to see the outage.
	failedRead := waitMetric(t, e.d, errorSeries, 15*time.Second, func(v float64) bool { return v > 0 })
	time.Sleep(time.Until(first503.end.Add(1500 * time.Millisecond)))
	unsealStart := time.Now()
	e.vault.unseal()
	unsealed := time.Now()
	recovered := l.waitFor(t, "200 after the unseal", first503.end, 15*time.Second, func(r reqResult) bool { return r.ok() })
	time.Sleep(time.Second) // and steady after recovery
	results := l.finish()
	polls := rp.finish()
	final := pollReady(&http.Client{Timeout: 5 * time.Second}, e.d.Admin)

	// The last good read, by egressd's account: every poll between the seal and the
	// unseal reports the age of the same one (no read succeeds while Vault is sealed),
	// and each poll bounds when it started; together they bound it tightly unless egressd
	// or this process stalled during every poll. From staleFrom to staleBy egressd may
	// answer either way; before, it must serve; after, it must refuse.
	var lastGoodFrom, lastGoodBy time.Time
	n := 0
	for _, p := range polls {
		if p.fetchErr != "" || p.version == "" || p.sent.Before(sealed) || p.at.After(unsealStart) {
			continue
		}
		lo, hi := p.lastGood()
		if n == 0 || lo.After(lastGoodFrom) {
			lastGoodFrom = lo
		}
		if n == 0 || hi.Before(lastGoodBy) {
			lastGoodBy = hi
		}
		n++
	}
	if n == 0 || lastGoodBy.Before(lastGoodFrom) {
		t.Fatalf("/readyz polls between the seal and the unseal do not agree on one last good read (%d polls, from %v to %v)", n, lastGoodFrom, lastGoodBy)
	}
	lastGood := lastGoodFrom.Add(lastGoodBy.Sub(lastGoodFrom) / 2)
	staleFrom, staleBy := lastGoodFrom.Add(vaultMaxStale), lastGoodBy.Add(vaultMaxStale)

	var beforeStale, failedBeforeStale, duringOutage, wrongDuringOutage, afterRecovery, failedAfterRecovery int
	kindsBefore := map[string]int{}
	for _, r := range results {
		switch {
		case r.end.Before(staleFrom.Add(-clockSlack)): // egressd decided before max_stale
			beforeStale++
			if !r.ok() {
				failedBeforeStale++
				kindsBefore[fmt.Sprintf("%d %s %s %s", r.status, r.reason, r.detail, r.err)]++
			}
		case r.start.After(staleBy.Add(clockSlack)) && r.end.Before(unsealStart): // after it
			duringOutage++
			if r.status != http.StatusServiceUnavailable || r.reason != "credential_unavailable" || r.detail != "stale" {
				wrongDuringOutage++
			}
		case r.start.After(recovered.end):
			afterRecovery++
			if !r.ok() {
				failedAfterRecovery++
			}
		}
	}
	seen := e.up.requests()[before:]
	var withoutV1 int
	for _, s := range seen {
		if !slices.Equal(s.auth, []string{"Bearer " + e.v1}) {
			withoutV1++
		}
	}
	var notReadyFrom, notReadyTo time.Time
	var readyEarly int
	var firstErr, lastErr string // the credential's error in /readyz during the outage
	for _, p := range polls {
		switch {
		case p.fetchErr != "":
		case p.code == http.StatusServiceUnavailable && !p.ready && !p.credOK && strings.HasPrefix(p.credErr, "stale"):
			if notReadyFrom.IsZero() {
				notReadyFrom, firstErr = p.at, p.credErr
			}
			notReadyTo, lastErr = p.at, p.credErr
		case p.code != http.StatusOK && p.at.Before(staleFrom.Add(-clockSlack)):
			readyEarly++
		}
	}
	_, failed, _ := tally(results)
	t.Logf("outage: last good read %s before the seal (±%dms), first 503 %s after the seal (%s after the last good read; max_stale %v), %d failed of %d before max_stale, %d of %d during the outage not 503 credential_unavailable (stale), %d upstream requests without the credential",
		secs(sealed.Sub(lastGood)), lastGoodBy.Sub(lastGoodFrom).Milliseconds()/2, secs(first503.start.Sub(sealed)), secs(first503.start.Sub(lastGood)), vaultMaxStale,
		failedBeforeStale, beforeStale, wrongDuringOutage, duringOutage, withoutV1)
	t.Logf("outage: first failed read counted %s after the seal, unsealed %s after the seal; recovered %s after the unseal returned (%s after it was sent; unseal took %s), %d failed of %d after recovery, %d failed of %d in all; /readyz not ready from %s to %s after the seal, ready after recovery: %v",
		secs(failedRead.Sub(sealed)), secs(unsealStart.Sub(sealed)),
		secs(recovered.end.Sub(unsealed)), secs(recovered.end.Sub(unsealStart)), secs(unsealed.Sub(unsealStart)),
		failedAfterRecovery, afterRecovery, failed, len(results), secs(notReadyFrom.Sub(sealed)), secs(notReadyTo.Sub(sealed)), final.code == http.StatusOK && final.ready)
	t.Logf("outage: /readyz credential error first %q, last %q", firstErr, lastErr)

	if failedBeforeStale > 0 {
		t.Errorf("%d of %d requests that ended before max_stale failed: %v", failedBeforeStale, beforeStale, kindsBefore)
	}
	if first503.end.Before(staleFrom.Add(-clockSlack)) {
		t.Errorf("first 503 for a request that ended %v after the last good read, before max_stale %v", first503.end.Sub(lastGood), vaultMaxStale)
	}
	if duringOutage == 0 || wrongDuringOutage > 0 {
		t.Errorf("%d of %d requests past max_stale and before the unseal were not 503 credential_unavailable (stale)", wrongDuringOutage, duringOutage)
	}
	if withoutV1 > 0 {
		t.Errorf("the upstream saw %d of %d requests without exactly Authorization: Bearer <version 1>", withoutV1, len(seen))
	}
	if afterRecovery == 0 || failedAfterRecovery > 0 {
		t.Errorf("%d of %d requests after the recovery failed", failedAfterRecovery, afterRecovery)
	}
	if notReadyFrom.IsZero() {
		t.Errorf("/readyz never said not ready (503, credential %s stale) during the outage", vaultCredID)
	}
	if readyEarly > 0 {
		t.Errorf("/readyz said not ready %d times before max_stale", readyEarly)
	}
	if final.code != http.StatusOK || !final.ready || !final.credOK || final.version != "1" {
		t.Errorf("/readyz after the recovery: %+v, want 200, ready, version 1", final)
	}
	if rec := e.d.lines(); !slices.ContainsFunc(rec, func(l logLine) bool {
		return l.Str("message") == "credential recovered" && l.Str("credential") == vaultCredID
	}) {
		t.Errorf("no \"credential recovered\" log line for %s", vaultCredID)
	}
	if n := e.d.metric(errorSeries); n == 0 {
		t.Errorf("%s = 0 after the outage", errorSeries)
	}
}

// TestVaultE2EWrongShapeAndDeleted: with max_stale at a minute, a secret of the wrong
// shape, and then a deleted one, make the credential unavailable at the next read (503
// at once, not after max_stale: Vault answered). The wrong shape's log line names the
// credential ID and not the value. A good version in between makes it servable again.
func TestVaultE2EWrongShapeAndDeleted(t *testing.T) {
	t.Parallel()
	e := startVaultE2E(t, time.Minute)
	// until polls one request every 50 ms until match accepts one, for at most within.
	until := func(desc string, within time.Duration, match func(reqResult) bool) (reqResult, time.Duration) {
		t.Helper()
		from := time.Now()
		c := e.client()
		defer c.CloseIdleConnections()
		for {
			r := fetchOnce(c, e.url)
			if match(r) {
				return r, r.end.Sub(from)
			}
			if time.Since(from) > within {
				t.Fatalf("%s: not within %v; last response %+v", desc, within, r)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	limit := time.Duration(float64(vaultRefresh)*1.1) + refreshSlack
	unavailable := func(r reqResult) bool { return r.status == http.StatusServiceUnavailable }
	checkRefusal := func(what string, r reqResult, detail string) {
		t.Helper()
		if r.reason != "credential_unavailable" || r.detail != detail {
			t.Errorf("%s: 503 with Egressd-Reason %q, detail %q; want credential_unavailable, %s", what, r.reason, r.detail, detail)
		}
	}

	// Wrong shape: {"tokn": ...}.
	planted := e.newSecret("v2-")
	if n := e.vault.putKV(vaultCredID, map[string]any{"tokn": planted}); n != 2 {
		t.Fatalf("KV write made version %d, want 2", n)
	}
	r, took := until("503 for the wrong shape", 2*limit, unavailable)
	checkRefusal("wrong shape", r, "invalid")
	t.Logf("wrong shape: 503 %s after the write (refresh %v, max_stale 1m)", secs(took), vaultRefresh)
	if took > limit {
		t.Errorf("wrong shape: 503 %v after the write, want within refresh+jitter+slack %v", took, limit)
	}
	failed := e.d.waitLog("credential read failed (invalid)", func(l logLine) bool {
		return l.Str("message") == "credential read failed" && l.Str("result") == "invalid"
	})
	t.Logf("wrong shape: egressd logged %q credential=%s error=%q", failed.Str("message"), failed.Str("credential"), failed.Str("error"))
	if failed.Str("credential") != vaultCredID || !strings.Contains(failed.Str("error"), "credential "+vaultCredID) ||
		!strings.Contains(failed.Str("error"), "tokn") {
		t.Errorf("the wrong-shape line does not name the credential ID %s and the bad key: %v", vaultCredID, failed)
	}
	var ready readyPoll
	if ready = pollReady(&http.Client{Timeout: 5 * time.Second}, e.d.Admin); ready.code != http.StatusServiceUnavailable || ready.credOK || !strings.HasPrefix(ready.credErr, "invalid") {
		t.Errorf("/readyz with the wrong shape: %+v, want 503, credential not ready (invalid)", ready)
	}
	if strings.Contains(string(e.d.LogBytes())+string(e.d.Stderr())+ready.credErr, planted) {
		t.Error("the wrong-shape value appears in egressd's log or /readyz")
	}

	// A good version again: served without a restart.
	v3 := e.newSecret("v3-")
	e.vault.putKV(vaultCredID, map[string]any{"token": v3})
	_, took = until("200 with version 3", 2*limit, func(r reqResult) bool { return r.ok() })
	t.Logf("wrong shape: served again %s after a good version 3 was written", secs(took))

	// Deleted: the current version soft-deleted.
	if code, out, err := e.vault.call("DELETE", kvPath(vaultCredID), nil); err != nil || code != http.StatusNoContent {
		t.Fatalf("vault DELETE %s: %d %v %v", kvPath(vaultCredID), code, out, err)
	}
	r, took = until("503 for the deleted secret", 2*limit, unavailable)
	checkRefusal("deleted", r, "not_found")
	t.Logf("deleted: 503 %s after the delete (refresh %v, max_stale 1m)", secs(took), vaultRefresh)
	if took > limit {
		t.Errorf("deleted: 503 %v after the delete, want within refresh+jitter+slack %v", took, limit)
	}
	if ready = pollReady(&http.Client{Timeout: 5 * time.Second}, e.d.Admin); ready.code != http.StatusServiceUnavailable || ready.credOK || !strings.HasPrefix(ready.credErr, "not_found") {
		t.Errorf("/readyz with the secret deleted: %+v, want 503, credential not ready (not_found)", ready)
	}

	// Every request the upstream saw carried a whole, valid version.
	for _, s := range e.up.requests() {
		if !slices.Equal(s.auth, []string{"Bearer " + e.v1}) && !slices.Equal(s.auth, []string{"Bearer " + v3}) {
			t.Errorf("the upstream saw Authorization %q, want version 1 or 3", s.auth)
		}
	}
}
