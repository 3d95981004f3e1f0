package oauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/testutil/githubstub"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// Secrets planted in the tests: none may reach a log line, an error or a metric.
const (
	clientSecret = "cs-PLANTED-8d1f"
	refresh1     = "snap-PLANTED-one-77a2"
	refresh2     = "snap-PLANTED-two-91c3"
)

// endpoint is a TLS token endpoint (httptest) that records every call.
type endpoint struct {
	srv      *httptest.Server
	mu       sync.Mutex
	calls    []url
	down     atomic.Bool   // answer 500
	refuse   atomic.Bool   // refuse every client (invalid_client), as after a revocation
	basicNo  bool          // refuse HTTP Basic client auth (invalid_client), accept the form
	rotate   bool          // answer the refresh-token grant with a new refresh token
	lifetime int           // expires_in, seconds
	issued   atomic.Int64  // access tokens issued
	delay    time.Duration // before answering
}

// url is one call: its grant, the refresh token sent, and how the client authenticated.
type url struct{ grant, refresh, auth, scope string }

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{lifetime: 3600}
	e.srv = httptest.NewTLSServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	r.ParseForm()
	c := url{grant: r.PostForm.Get("grant_type"), refresh: r.PostForm.Get("refresh_token"), scope: r.PostForm.Get("scope")}
	user, pass, basic := r.BasicAuth()
	switch {
	case basic:
		c.auth = "basic " + user + ":" + pass
	case r.PostForm.Get("client_id") != "":
		c.auth = "form " + r.PostForm.Get("client_id") + ":" + r.PostForm.Get("client_secret")
	}
	e.mu.Lock()
	e.calls = append(e.calls, c)
	e.mu.Unlock()
	time.Sleep(e.delay)
	w.Header().Set("Content-Type", "application/json")
	if e.down.Load() {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, `{"error": "temporarily_unavailable", "error_description": "echo %s %s"}`, c.refresh, pass)
		return
	}
	if e.refuse.Load() || (basic && e.basicNo) || c.auth != "basic cid:"+clientSecret && c.auth != "form cid:"+clientSecret {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error": "invalid_client"}`)
		return
	}
	n := e.issued.Add(1)
	resp := map[string]any{"access_token": fmt.Sprintf("at-PLANTED-%d", n), "token_type": "bearer", "expires_in": e.lifetime}
	if e.rotate && c.grant == "refresh_token" {
		resp["refresh_token"] = refresh2
	}
	json.NewEncoder(w).Encode(resp)
}

// styles counts the calls by client authentication: HTTP Basic and the form.
func (e *endpoint) styles() (basic, form int) {
	for _, c := range e.log() {
		switch {
		case strings.HasPrefix(c.auth, "basic "):
			basic++
		case strings.HasPrefix(c.auth, "form "):
			form++
		}
	}
	return basic, form
}

func (e *endpoint) log() []url {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]url(nil), e.calls...)
}

// rig is a file-backed Store, the Manager over it and its log.
type rig struct {
	t       testing.TB
	path    string
	store   *credential.Store
	m       *Manager
	log     *syncbuf.Buffer
	results sync.Map
	now     atomic.Pointer[time.Time] // nil: the real clock
}

// newRig writes creds (ID -> secret JSON) to a file and starts a Store and a Manager.
func newRig(t testing.TB, e *endpoint, creds map[string]string, writable bool) *rig {
	t.Helper()
	return startRig(t, "TOKEN_URL", e.srv.URL+"/token", testClient(t, e), creds, writable)
}

// startRig is newRig with every placeholder in creds replaced by value, and token calls
// through client.
func startRig(t testing.TB, placeholder, value string, client *http.Client, creds map[string]string, writable bool) *rig {
	t.Helper()
	r := &rig{t: t, log: &syncbuf.Buffer{}, path: filepath.Join(t.TempDir(), "credentials.json")}
	var parts []string
	var ids []string
	for id, s := range creds {
		parts = append(parts, fmt.Sprintf("%q: %s", id, strings.ReplaceAll(s, placeholder, value)))
		ids = append(ids, id)
	}
	if err := os.WriteFile(r.path, []byte("{\n  "+strings.Join(parts, ",\n  ")+"\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(r.log)
	b := file.New(r.path, file.Options{PollInterval: 20 * time.Millisecond, Log: log})
	r.store = credential.NewStore(b, ids, credential.Options{Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	r.store.Start(ctx)
	count := func(id, res string) {
		n, _ := r.results.LoadOrStore(id+" "+res, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	o := Options{Log: log, Tick: 20 * time.Millisecond, Metrics: count, Mint: count, Now: r.clock}
	if writable {
		o.Writer = b
	}
	r.m = New(r.store, o)
	r.m.SetClient(client)
	r.m.Start(ctx)
	t.Cleanup(func() {
		cancel()
		r.m.Wait()
		r.store.Wait()
		for _, s := range []string{clientSecret, refresh1, refresh2, "at-PLANTED", githubstub.TokenPrefix, "PRIVATE KEY"} {
			if strings.Contains(r.log.String(), s) {
				t.Errorf("the log shows a secret (%s):\n%s", s, r.log)
			}
		}
	})
	return r
}

// settle lets no further call start for id, whose back-off must be running (a failed
// call), and waits for the running one: calls and counts are final after. The clock goes
// back to 1970, before every back-off ends; ending the Manager instead would cut off a
// call that the endpoint may or may not have seen.
func (r *rig) settle(t *testing.T, id string) {
	past := time.Unix(1, 0)
	r.now.Store(&past)
	st := r.m.state(id)
	eventually(t, "the running call", func() bool { return !st.busy.Load() })
}

func (r *rig) clock() time.Time {
	if p := r.now.Load(); p != nil {
		return *p
	}
	return time.Now()
}

func (r *rig) count(id, result string) int64 {
	if n, ok := r.results.Load(id + " " + result); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// testClient is NewClient over a guard that opens loopback (the endpoint's address), with
// the endpoint's certificate trusted.
func testClient(t testing.TB, e *endpoint) *http.Client {
	roots := e.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return guardedClient(t, roots, netip.MustParsePrefix("127.0.0.0/8"))
}

// guardedClient is NewClient over a guard that opens the given prefixes (none: the
// default guard, which refuses loopback), trusting roots.
func guardedClient(t testing.TB, roots *x509.CertPool, open ...netip.Prefix) *http.Client {
	g, err := netguard.New(netguard.Options{UnsafeAllowCIDRs: open})
	if err != nil {
		t.Fatal(err)
	}
	return NewClient(g, netguard.NewResolver("", time.Second), &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, time.Second)
}

func (r *rig) header(id string) (string, error) {
	v, err := r.m.Get(id)
	if err != nil {
		return "", err
	}
	if len(v.Headers) != 1 || v.Headers[0].Name != "Authorization" {
		r.t.Fatalf("headers %v", v.Headers)
	}
	return v.Headers[0].Value, nil
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

const oauthSecret = `{"type": "oauth2", "client_id": "cid", "client_secret": "` + clientSecret + `", "refresh_token": "` + refresh1 + `", "token_url": "TOKEN_URL", "scopes": ["read", "write"]}`

func TestRefreshTokenGrantWithBasicAuth(t *testing.T) {
	e := newEndpoint(t)
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	if h, err := r.header("oa"); err != nil || h != "Bearer at-PLANTED-1" {
		t.Fatalf("header = %q, %v", h, err)
	}
	calls := e.log()
	want := url{grant: "refresh_token", refresh: refresh1, auth: "basic cid:" + clientSecret}
	if len(calls) != 1 || calls[0] != want {
		t.Errorf("token calls = %+v, want one %+v", calls, want)
	}
	if r.count("oa", ResultOK) != 1 {
		t.Error("no ok counted")
	}
}

func TestBasicRefusedFallsBackToForm(t *testing.T) {
	e := newEndpoint(t)
	e.basicNo = true
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	if h, err := r.header("oa"); err != nil || h != "Bearer at-PLANTED-1" {
		t.Fatalf("header = %q, %v", h, err)
	}
	calls := e.log()
	if len(calls) != 2 || !strings.HasPrefix(calls[0].auth, "basic ") || calls[1].auth != "form cid:"+clientSecret {
		t.Errorf("token calls = %+v, want Basic then the form", calls)
	}
}

func TestClientCredentialsWithoutRefreshToken(t *testing.T) {
	e := newEndpoint(t)
	r := newRig(t, e, map[string]string{"cc": `{"type": "oauth2", "client_id": "cid", "client_secret": "` + clientSecret + `", "token_url": "TOKEN_URL", "scopes": ["read", "write"]}`}, false)
	if h, err := r.header("cc"); err != nil || h != "Bearer at-PLANTED-1" {
		t.Fatalf("header = %q, %v", h, err)
	}
	if c := e.log(); len(c) != 1 || c[0].grant != "client_credentials" || c[0].scope != "read write" || c[0].refresh != "" {
		t.Errorf("token calls = %+v", c)
	}
}

// TestRefreshAheadOfExpiry: a 4 s token is replaced before it expires, one call at a time,
// so the header never goes missing.
func TestRefreshAheadOfExpiry(t *testing.T) {
	e := newEndpoint(t)
	e.lifetime = 4
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		if _, err := r.header("oa"); err != nil {
			t.Fatalf("at %v: %v", time.Since(start), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.issued.Load(); n < 2 || n > 4 {
		t.Errorf("%d tokens issued in 5 s of 4 s tokens, want 2 to 4 (refreshed ahead, not per request)", n)
	}
}

// TestSingleFlight: many requests while there is no token make one call.
func TestSingleFlight(t *testing.T) {
	e := newEndpoint(t)
	e.down.Store(true)
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	e.delay = 300 * time.Millisecond
	e.down.Store(false)
	before := len(e.log())
	r.m.state("oa").due.Store(0)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { r.m.Get("oa") })
	}
	wg.Wait()
	eventually(t, "a token", func() bool { _, err := r.header("oa"); return err == nil })
	if n := len(e.log()) - before; n != 1 {
		t.Errorf("%d token calls for 50 concurrent requests, want 1", n)
	}
}

// TestRotatedRefreshTokenUsedAndWrittenBack: the endpoint's new refresh token is used for
// the next call and written to the file, with every other entry byte for byte unchanged.
func TestRotatedRefreshTokenUsedAndWrittenBack(t *testing.T) {
	e := newEndpoint(t)
	e.rotate = true
	other := `{"headers":   {"X-Note": "kept as written"}, "token": "other-PLANTED-x"}`
	r := newRig(t, e, map[string]string{"oa": oauthSecret, "other": other}, true)
	eventually(t, "the rotated token written back", func() bool {
		b, _ := os.ReadFile(r.path)
		return strings.Contains(string(b), refresh2)
	})
	after, _ := os.ReadFile(r.path)
	if !strings.Contains(string(after), `"other": `+other) {
		t.Errorf("the other entry changed:\n%s", after)
	}
	var doc map[string]map[string]any
	if err := json.Unmarshal(after, &doc); err != nil || doc["oa"]["refresh_token"] != refresh2 || doc["oa"]["client_secret"] != clientSecret || doc["oa"]["type"] != "oauth2" {
		t.Fatalf("written back: %v", err)
	}
	if fi, _ := os.Stat(r.path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	// The next call uses the rotated token.
	r.m.state("oa").cur.Store(nil)
	r.m.Get("oa")
	eventually(t, "a second call", func() bool { return len(e.log()) >= 2 })
	if c := e.log(); c[1].refresh != refresh2 {
		t.Errorf("second call sent refresh token %q, want the rotated one", c[1].refresh)
	}
	// The refresh goroutine writes the file just before it logs the write-back.
	eventually(t, "the write-back line", func() bool { return strings.Contains(r.log.String(), "rotated and written back") })
}

func TestRotationWithoutWriterWarns(t *testing.T) {
	e := newEndpoint(t)
	e.rotate = true
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	if _, err := r.header("oa"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.log.String(), `"level":"warn"`) || !strings.Contains(r.log.String(), "lost on restart") {
		t.Errorf("no WARN:\n%s", r.log)
	}
	if b, _ := os.ReadFile(r.path); strings.Contains(string(b), refresh2) {
		t.Error("written without a writer")
	}
}

// TestEndpointDownServesUntilExpiryThenUnavailable: the last token serves until it
// expires, never after; then credential_unavailable (no_access_token).
func TestEndpointDownServesUntilExpiryThenUnavailable(t *testing.T) {
	e := newEndpoint(t)
	e.lifetime = 100
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	if _, err := r.header("oa"); err != nil {
		t.Fatal(err)
	}
	e.down.Store(true)
	now := time.Now().Add(90 * time.Second) // past the refresh point, before expiry
	r.now.Store(&now)
	eventually(t, "a failed refresh", func() bool { return r.count("oa", ResultError) > 0 })
	if h, err := r.header("oa"); err != nil || h != "Bearer at-PLANTED-1" {
		t.Errorf("before expiry: %q %v, want the last token", h, err)
	}
	later := time.Now().Add(96 * time.Second) // within the skew before expiry: not sent
	r.now.Store(&later)
	_, err := r.m.Get("oa")
	var ue *credential.UnavailableError
	if !errors.As(err, &ue) || ue.Cause != credential.CauseNoAccessToken {
		t.Fatalf("after expiry: %v, want no_access_token", err)
	}
	for _, s := range []string{clientSecret, refresh1, "at-PLANTED"} {
		if strings.Contains(err.Error(), s) {
			t.Error("the error shows a secret")
		}
	}
	// The refresh goroutine counts the failure just before it writes the line.
	eventually(t, "the failure line", func() bool {
		return strings.Contains(r.log.String(), "oauth2 token refresh failed") && strings.Contains(r.log.String(), "500 Internal Server Error")
	})
}

// BenchmarkGet is the per-request cost of an oauth2 credential (a cached access token)
// against a plain credential read from the same store.
func BenchmarkGet(b *testing.B) {
	e := &endpoint{lifetime: 3600}
	e.srv = httptest.NewTLSServer(http.HandlerFunc(e.serve))
	defer e.srv.Close()
	r := newRig(b, e, map[string]string{"oa": oauthSecret, "plain": `{"token": "plain-token"}`}, false)
	for _, id := range []string{"plain", "oa"} {
		b.Run(id, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.m.Get(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
