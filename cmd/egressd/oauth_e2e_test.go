package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

const (
	oauthHost   = "auth.oauth-e2e.test" // the token endpoint: not on the allowlist
	oauthSecret = "cs-PLANTED-e2e-4411"
	oauthRT     = "snap-PLANTED-e2e-5522"
)

// tokenEndpoint is an HTTPS oauth2 token endpoint on 127.0.0.1 that issues
// at-PLANTED-<n> tokens of a fixed lifetime and records each call's client auth.
type tokenEndpoint struct {
	port   int
	caPEM  []byte
	down   atomic.Bool
	delay  atomic.Int64 // nanoseconds each answer waits; -1: never answers
	issued atomic.Int64
	mu     sync.Mutex
	auths  []string
}

// calls is how many token calls the endpoint has seen.
func (e *tokenEndpoint) calls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.auths)
}

// mintingConfig is the config of a run whose credential egressd mints from a token
// endpoint on loopback: the allowlist entries (flow mappings, one a line), the stub
// resolver that names the endpoint, the roots trusted upstream and the credentials file.
func mintingConfig(env, entries, resolver, caFile, credFile string) string {
	return fmt.Sprintf(`version: 1
environment: %s
listeners:
  - {name: sandbox, address: "127.0.0.1:0", mode: proxy, role: sandbox}
admin: {address: "127.0.0.1:0"}
policy:
  allowlist:
    - %s
network:
  resolver: %q
  unsafe_allow_cidrs: [127.0.0.0/8]
tls: {intercept: auto, upstream_ca_file: %q}
credentials: {backend: file, file: %q}
log: {level: info, format: json}
state_dir: state
`, env, strings.ReplaceAll(entries, "\n", "\n    - "), resolver, caFile, credFile)
}

func startTokenEndpoint(t *testing.T, lifetime int) *tokenEndpoint {
	ca := testpki.New(t)
	e := &tokenEndpoint{caPEM: ca.PEM()}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		switch d := time.Duration(e.delay.Load()); {
		case d < 0:
			<-r.Context().Done()
			return
		case d > 0:
			time.Sleep(d)
		}
		u, p, _ := r.BasicAuth()
		e.mu.Lock()
		e.auths = append(e.auths, r.PostForm.Get("grant_type")+" "+u+":"+p+" "+r.PostForm.Get("refresh_token"))
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if e.down.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("at-PLANTED-%d", e.issued.Add(1)),
			"token_type": "Bearer", "expires_in": lifetime})
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, oauthHost)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	e.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return e
}

// TestRunOAuth2: egressd gets an access token from the token endpoint (its own call,
// through the address guard, trusting upstream_ca_file; the endpoint is not on the
// allowlist), the upstream sees exactly "Bearer <access token>"; with the endpoint down
// the last token serves until it expires, then 503 credential_unavailable and nothing
// reaches the upstream.
func TestRunOAuth2(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t, 6)
	up := startRecordingUpstream(t)
	d, e, target := startOAuthRunner(t, te, up, "")
	if r := fetchOnce(e.client(), target); !r.ok() {
		t.Fatalf("first request: %+v", r)
	}
	if seen := up.requests(); len(seen) != 1 || !slices.Equal(seen[0].auth, []string{"Bearer at-PLANTED-1"}) {
		t.Fatalf("upstream saw %v, want exactly [Bearer at-PLANTED-1]", authOf(seen))
	}
	te.mu.Lock()
	first := te.auths[0]
	te.mu.Unlock()
	if first != "refresh_token cid:"+oauthSecret+" "+oauthRT {
		t.Errorf("token call = %q, want the refresh-token grant with HTTP Basic client auth", first)
	}
	if v := d.metric(`egressd_oauth_refresh_total{credential="api",result="ok"}`); v < 1 {
		t.Errorf("oauth_refresh_total ok = %v", v)
	}

	te.down.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	var last reqResult
	for time.Now().Before(deadline) {
		if last = fetchOnce(e.client(), target); !last.ok() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last.status != http.StatusServiceUnavailable || last.reason != "credential_unavailable" || last.detail != "no_access_token" {
		t.Fatalf("after the token expired: %+v, want 503 credential_unavailable (no_access_token)", last)
	}
	n := len(up.requests())
	for _, s := range up.requests() {
		if len(s.auth) != 1 || !strings.HasPrefix(s.auth[0], "Bearer at-PLANTED-") {
			t.Errorf("upstream saw Authorization %q", s.auth)
		}
	}
	if r := fetchOnce(e.client(), target); r.status != http.StatusServiceUnavailable || len(up.requests()) != n {
		t.Errorf("a request after expiry reached the upstream: %+v", r)
	}
	if v := d.metric(`egressd_oauth_refresh_total{credential="api",result="error"}`); v < 1 {
		t.Errorf("oauth_refresh_total error = %v", v)
	}

	// 20 requests a second for 3 s find no token: egressd still calls the failing endpoint
	// on its own back-off only (at most 3 calls in any 3 s once a call has failed; 4 leaves
	// room for the requests' own time), each call counted once.
	before, c := te.calls(), e.client()
	tick := time.NewTicker(50 * time.Millisecond)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); <-tick.C {
		if r := fetchOnce(c, target); r.status != http.StatusServiceUnavailable {
			t.Fatalf("with the endpoint down: %+v, want 503", r)
		}
	}
	tick.Stop()
	made := te.calls() - before
	t.Logf("%d token calls in 3 s of 20 requests a second", made)
	if made > 4 {
		t.Errorf("%d token calls in 3 s of 20 requests a second, want at most 4 (the back-off's)", made)
	}
	counted := func() int {
		return int(d.metric(`egressd_oauth_refresh_total{credential="api",result="ok"}`) +
			d.metric(`egressd_oauth_refresh_total{credential="api",result="error"}`))
	}
	// A call is counted once its answer is read: wait out one in flight.
	for deadline := time.Now().Add(5 * time.Second); counted() != te.calls() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if n, calls := counted(), te.calls(); n != calls {
		t.Errorf("oauth_refresh_total counted %d calls, the endpoint saw %d", n, calls)
	}
	all := string(d.LogBytes()) + string(d.Stderr())
	for _, s := range []string{oauthSecret, oauthRT, "at-PLANTED"} {
		if strings.Contains(all, s) {
			t.Errorf("the log shows a secret (%s)", s)
		}
	}
}

// startOAuthRunner starts egressd with one oauth2 credential "api" whose token_url is
// te, injected on requests to up (at target); extra is appended to the config.
func startOAuthRunner(t *testing.T, te *tokenEndpoint, up *recordingUpstream, extra string) (*runner, *vaultE2E, string) {
	t.Helper()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "roots.pem")
	upCA, _ := os.ReadFile(up.caFile)
	credFile := filepath.Join(dir, "credentials.json")
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(caFile, append(upCA, te.caPEM...), 0o600))
	must(os.WriteFile(credFile, fmt.Appendf(nil, `{"api": {"type": "oauth2", "client_id": "cid", "client_secret": %q,
  "refresh_token": %q, "token_url": "https://%s:%d/token"}}`, oauthSecret, oauthRT, oauthHost, te.port), 0o600))
	dns := dnsstub.Start(t)
	dns.Set(vaultHost, "A 127.0.0.1")
	dns.Set(oauthHost, "A 127.0.0.1")
	d := startFileLoggedRunner(t, mintingConfig("env_oauth_e2e", fmt.Sprintf("{domain: %s, ports: [%d], credential: api}", vaultHost, up.port),
		dns.Addr, caFile, credFile)+extra)
	code, pem := d.adminGet("/ca.pem")
	roots := x509.NewCertPool()
	if code != http.StatusOK || !roots.AppendCertsFromPEM([]byte(pem)) {
		t.Fatalf("/ca.pem: %d", code)
	}
	return d, &vaultE2E{t: t, d: d, roots: roots}, fmt.Sprintf("https://%s:%d/", vaultHost, up.port)
}
