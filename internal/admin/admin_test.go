package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/admin"
	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/explain"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
)

// telemetryKey is a transform value: explain must name its header, never show it.
const telemetryKey = "admin-test-secret-value"

// fakeState is the admin endpoints' view of a running egressd, with a Snapshot
// built the way the daemon builds one (no listener, no network: explain is offline).
type fakeState struct {
	snap   *proxy.Snapshot
	hash   string
	loaded time.Time

	mu     sync.Mutex
	ready  bool
	detail map[string]any
	reload func() (string, error) // nil: a reload that succeeds with hash
	last   admin.ReloadStatus
}

func (s *fakeState) Snapshot() *proxy.Snapshot { return s.snap }

func (s *fakeState) JWKS() []byte { return []byte(`{"keys":[]}`) }

func (s *fakeState) CAPEM() []byte { return []byte("-----BEGIN CERTIFICATE-----\n") }

func (s *fakeState) ConfigInfo() (string, time.Time) { return s.hash, s.loaded }

func (s *fakeState) LastReload() admin.ReloadStatus { return s.last }

func (s *fakeState) Ready() (bool, map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready, s.detail
}

func (s *fakeState) Reload() (string, error) {
	if s.reload == nil {
		return s.hash, nil
	}
	return s.reload()
}

func (s *fakeState) setReady(ok bool, detail map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready, s.detail = ok, detail
}

func newState(t *testing.T) *fakeState {
	t.Helper()
	pol, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "*.github.com"},
		{Domain: "telemetry.example.com", Transform: []allowlist.Header{{Name: "X-Telemetry-Key", Value: telemetryKey}}},
		{Domain: "api.example.com", Credential: "example-api"},
		{Domain: "*"},
	}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := netguard.New(netguard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	limits := config.Default().Limits
	snap := &proxy.Snapshot{
		Env: "env_admin", Policy: pol, Guard: guard, Limits: limits,
		Resolver: netguard.NewResolver("", limits.DNS),
	}
	snap.Prepare()
	t.Cleanup(snap.Close)
	return &fakeState{
		snap: snap, hash: "c0ffee", loaded: time.Date(2026, 3, 1, 12, 30, 0, 0, time.FixedZone("CET", 3600)),
		ready: true, detail: map[string]any{"config": "loaded"},
	}
}

// serve makes one request to the admin handler and returns the response and its body.
func serve(t *testing.T, h http.Handler, method, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

// decodeJSON checks that res is a JSON response and decodes its body into v.
func decodeJSON(t *testing.T, res *http.Response, body string, v any) {
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
}

func TestHealthz(t *testing.T) {
	st := newState(t)
	res, body := serve(t, admin.Handler(st, metrics.New(), true), http.MethodGet, "/healthz")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d, want 200\n%s", res.StatusCode, body)
	}
	var got struct {
		Status       string    `json:"status"`
		ConfigHash   string    `json:"config_hash"`
		ConfigLoaded time.Time `json:"config_loaded"`
	}
	decodeJSON(t, res, body, &got)
	if got.Status != "ok" || got.ConfigHash != st.hash || !got.ConfigLoaded.Equal(st.loaded) {
		t.Errorf("GET /healthz = %+v, want status ok, config_hash %q, config_loaded %v", got, st.hash, st.loaded)
	}
	if !strings.Contains(body, `"2026-03-01T11:30:00Z"`) {
		t.Errorf("config_loaded is not rendered in UTC:\n%s", body)
	}
}

func TestReadyz(t *testing.T) {
	st := newState(t)
	h := admin.Handler(st, metrics.New(), true)
	for _, tc := range []struct {
		name   string
		ready  bool
		detail map[string]any
		want   int
	}{
		{"ready", true, map[string]any{"config": "loaded", "credentials": map[string]any{"example-api": "ok"}}, http.StatusOK},
		{"not ready", false, map[string]any{"config": "loaded", "credentials": map[string]any{"example-api": "unavailable"}}, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st.setReady(tc.ready, maps.Clone(tc.detail))
			res, body := serve(t, h, http.MethodGet, "/readyz")
			if res.StatusCode != tc.want {
				t.Fatalf("GET /readyz: %d, want %d\n%s", res.StatusCode, tc.want, body)
			}
			var got map[string]any
			decodeJSON(t, res, body, &got)
			if got["ready"] != tc.ready {
				t.Errorf(`"ready" = %v, want %t`, got["ready"], tc.ready)
			}
			for k, v := range tc.detail {
				gotJSON, _ := json.Marshal(got[k])
				wantJSON, _ := json.Marshal(v)
				if string(gotJSON) != string(wantJSON) {
					t.Errorf("%q = %s, want %s", k, gotJSON, wantJSON)
				}
			}
		})
	}
}

// TestReadyzDetailNotOwned: the detail map belongs to the State, which may return
// nil (nothing to add) or a map it shares between calls. The handler must neither
// panic on nil nor write "ready" into the State's map, which concurrent /readyz
// requests would otherwise do at once.
func TestReadyzDetailNotOwned(t *testing.T) {
	st := newState(t)
	h := admin.Handler(st, metrics.New(), true)

	st.setReady(false, nil)
	res, body := serve(t, h, http.MethodGet, "/readyz")
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"ready": false`) {
		t.Errorf("GET /readyz with nil detail: %d %s, want 503 with \"ready\": false", res.StatusCode, body)
	}

	shared := map[string]any{"config": "loaded"}
	st.setReady(true, shared)
	serve(t, h, http.MethodGet, "/readyz")
	if _, ok := shared["ready"]; ok || len(shared) != 1 {
		t.Errorf("GET /readyz wrote into the State's detail map: %v", shared)
	}
}

func TestMetrics(t *testing.T) {
	m := metrics.New()
	m.InitListener("sandbox")
	m.ConfigReloads.WithLabelValues("ok").Inc()
	res, body := serve(t, admin.Handler(newState(t), m, true), http.MethodGet, "/metrics")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d, want 200\n%s", res.StatusCode, body)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q, want the Prometheus text format", ct)
	}
	for _, want := range []string{
		`egressd_requests_total{decision="allow",listener="sandbox",reason=""} 0`,
		`egressd_requests_total{decision="deny",listener="sandbox",reason="not_allowlisted"} 0`,
		`egressd_requests_total{decision="error",listener="sandbox",reason="dns_failure"} 0`,
		`egressd_requests_total{decision="deny",listener="sandbox",reason="credential_scope"} 0`,
		`egressd_config_reloads_total{result="ok"} 1`,
		`egressd_config_reloads_total{result="error"} 0`,
		`egressd_bytes_total{direction="in"} 0`,
		`egressd_leaf_cache_total{result="miss"} 0`,
		`egressd_tunnels_active 0`,
		`egressd_request_duration_seconds_count{listener="sandbox"} 0`,
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	for _, r := range allowlist.Reasons { // credential_scope among them
		decision := "error"
		if r.IsDenial() {
			decision = "deny"
		}
		if want := `egressd_requests_total{decision="` + decision + `",listener="sandbox",reason="` + string(r) + `"} 0`; !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
}

func TestExplain(t *testing.T) {
	h := admin.Handler(newState(t), metrics.New(), true)
	for _, tc := range []struct {
		url  string
		want explain.Result
	}{
		{"https://api.github.com/repos", explain.Result{
			Scheme: "https", Host: "api.github.com", Port: 443, Decision: "allow", Rule: "*.github.com"}},
		{"https://telemetry.example.com/v1", explain.Result{
			Scheme: "https", Host: "telemetry.example.com", Port: 443, Decision: "allow", Rule: "telemetry.example.com",
			Intercept: true, Inject: []string{"X-Telemetry-Key"}}},
		{"https://api.example.com/", explain.Result{
			Scheme: "https", Host: "api.example.com", Port: 443, Decision: "allow", Rule: "api.example.com",
			Intercept: true, Credential: "example-api"}},
		{"http://169.254.169.254/latest/meta-data/", explain.Result{
			Scheme: "http", Host: "169.254.169.254", Port: 80, Decision: "deny", Reason: "internal_address",
			Detail: "metadata", Rule: "*"}},
		{"http://[::ffff:127.0.0.1]:8080/", explain.Result{
			Scheme: "http", Host: "::ffff:127.0.0.1", Port: 8080, Decision: "deny", Reason: "port_not_allowed", Rule: "*"}},
		{"ftp://example.com/", explain.Result{
			Scheme: "ftp", Decision: "deny", Reason: "bad_request", Detail: "scheme", // the proxy's detail
			Note: `unsupported scheme "ftp" (use http or https)`}},
	} {
		t.Run(tc.url, func(t *testing.T) {
			res, body := serve(t, h, http.MethodGet, "/v1/explain?url="+url.QueryEscape(tc.url))
			if res.StatusCode != http.StatusOK {
				t.Fatalf("GET /v1/explain: %d, want 200\n%s", res.StatusCode, body)
			}
			var got explain.Result
			decodeJSON(t, res, body, &got)
			if got.URL != tc.url || got.Scheme != tc.want.Scheme || got.Host != tc.want.Host || got.Port != tc.want.Port ||
				got.Decision != tc.want.Decision || got.Reason != tc.want.Reason || got.Detail != tc.want.Detail ||
				got.Rule != tc.want.Rule || got.Intercept != tc.want.Intercept || got.Credential != tc.want.Credential ||
				strings.Join(got.Inject, ",") != strings.Join(tc.want.Inject, ",") {
				t.Errorf("explain %s =\n%s\nwant %+v", tc.url, body, tc.want)
			}
			if got.Message == "" {
				t.Errorf("explain %s: empty message", tc.url)
			}
			if strings.Contains(body, telemetryKey) {
				t.Errorf("explain %s shows a header value:\n%s", tc.url, body)
			}
		})
	}
}

func TestExplainWithoutURL(t *testing.T) {
	h := admin.Handler(newState(t), metrics.New(), true)
	for _, target := range []string{"/v1/explain", "/v1/explain?url="} {
		res, body := serve(t, h, http.MethodGet, target)
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400\n%s", target, res.StatusCode, body)
			continue
		}
		var got map[string]string
		decodeJSON(t, res, body, &got)
		if got["error"] == "" {
			t.Errorf("GET %s: no error in %s", target, body)
		}
	}
}

func TestRouting(t *testing.T) {
	h := admin.Handler(newState(t), metrics.New(), true)
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodGet, "/", http.StatusNotFound},
		{http.MethodGet, "/nope", http.StatusNotFound},
		{http.MethodGet, "/healthz/extra", http.StatusNotFound},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/readyz", http.StatusMethodNotAllowed},
		{http.MethodPut, "/metrics", http.StatusMethodNotAllowed},
		{http.MethodPost, "/v1/explain?url=http://a.test/", http.StatusMethodNotAllowed},
		{http.MethodHead, "/healthz", http.StatusOK},
	} {
		res, body := serve(t, h, tc.method, tc.target)
		if res.StatusCode != tc.want {
			t.Errorf("%s %s: %d, want %d\n%s", tc.method, tc.target, res.StatusCode, tc.want, body)
		}
		if tc.want == http.StatusMethodNotAllowed && !strings.Contains(res.Header.Get("Allow"), http.MethodGet) {
			t.Errorf("%s %s: Allow = %q, want GET in it", tc.method, tc.target, res.Header.Get("Allow"))
		}
	}
}

// TestReload: POST /v1/reload answers 200 with the new hash, or 422 with every problem
// (path, file, line) when the State rejects the config; a rejection is never a 5xx.
func TestReload(t *testing.T) {
	st := newState(t)
	h := admin.Handler(st, metrics.New(), true)

	st.reload = func() (string, error) { return "beef", nil }
	res, body := serve(t, h, http.MethodPost, "/v1/reload")
	var ok struct {
		Result     string `json:"result"`
		ConfigHash string `json:"config_hash"`
	}
	decodeJSON(t, res, body, &ok)
	if res.StatusCode != http.StatusOK || ok.Result != "ok" || ok.ConfigHash != "beef" {
		t.Errorf("POST /v1/reload (accepted): %d %s, want 200 result ok, config_hash beef", res.StatusCode, body)
	}

	type rejected struct {
		Result   string           `json:"result"`
		Problems []config.Problem `json:"problems"`
	}
	verr := &config.ValidationError{Problems: []config.Problem{
		{Path: "network.allowlist[0].domain", Msg: "required", File: "/etc/egressd/environment.json", Line: 4},
		{Path: "limits.dial", Msg: `"forever" is not a duration`, Line: 9},
	}}
	for _, tc := range []struct {
		name string
		err  error
		want []config.Problem
	}{
		{"validation", fmt.Errorf("reload: %w", verr), verr.Problems},
		{"other", errors.New("policy: open /x.json: no such file or directory"),
			[]config.Problem{{Msg: "policy: open /x.json: no such file or directory"}}},
	} {
		st.reload = func() (string, error) { return "", tc.err }
		res, body := serve(t, h, http.MethodPost, "/v1/reload")
		var got rejected
		decodeJSON(t, res, body, &got)
		if res.StatusCode != http.StatusUnprocessableEntity || got.Result != "error" {
			t.Errorf("%s: POST /v1/reload: %d %s, want 422 result error", tc.name, res.StatusCode, body)
		}
		if fmt.Sprint(got.Problems) != fmt.Sprint(tc.want) {
			t.Errorf("%s: problems %+v, want %+v", tc.name, got.Problems, tc.want)
		}
	}

	res, body = serve(t, h, http.MethodGet, "/v1/reload")
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != http.MethodPost {
		t.Errorf("GET /v1/reload: %d (Allow %q) %s, want 405 allowing POST", res.StatusCode, res.Header.Get("Allow"), body)
	}
}

// TestPprof: /debug/pprof/ is served only when WithPprof wraps the handler, and the
// other endpoints keep their routing under it.
func TestPprof(t *testing.T) {
	plain := admin.Handler(newState(t), metrics.New(), true)
	if res, _ := serve(t, plain, http.MethodGet, "/debug/pprof/cmdline"); res.StatusCode != http.StatusNotFound {
		t.Errorf("without admin.pprof: GET /debug/pprof/cmdline = %d, want 404", res.StatusCode)
	}
	h := admin.WithPprof(plain)
	for _, tc := range []struct {
		method, target string
		want           int
	}{
		{http.MethodGet, "/debug/pprof/cmdline", http.StatusOK},
		{http.MethodGet, "/debug/pprof/", http.StatusOK},
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nope", http.StatusNotFound},
	} {
		if res, body := serve(t, h, tc.method, tc.target); res.StatusCode != tc.want {
			t.Errorf("with admin.pprof: %s %s = %d, want %d\n%s", tc.method, tc.target, res.StatusCode, tc.want, body)
		}
	}
}

// credSecret is a credential value: /v1/explain may name its header, never show it.
const credSecret = "admin-test-credential-secret"

// TestExplainCredentialHeaders: /v1/explain lists the header names a credential
// sets, read from the running credential store (a real file backend), and never
// a value; for a credential the store cannot serve, it names the credential and
// says its headers are unknown.
func TestExplainCredentialHeaders(t *testing.T) {
	dir := t.TempDir()
	credFile := filepath.Join(dir, "credentials.json")
	secrets := `{"example-api": {"headers": {"x-api-key": "` + credSecret + `", "X-Second": "` + credSecret + `2"}},
		"bearer": {"type": "bearer_token", "token": "` + credSecret + `3", "header_name": "X-Goog-Api-Key", "prefix": ""}}`
	if err := os.WriteFile(credFile, []byte(secrets), 0o600); err != nil {
		t.Fatal(err)
	}
	st := newState(t)
	pol, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "api.example.com", Credential: "example-api",
			Transform: []allowlist.Header{{Name: "X-Api-Key", Value: telemetryKey}, {Name: "X-Trace", Value: telemetryKey}}},
		{Domain: "goog.example.com", Credential: "bearer"},
		{Domain: "gone.example.com", Credential: "gone"},
	}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := credential.NewStore(file.New(credFile, file.Options{}), []string{"bearer", "example-api", "gone"}, credential.Options{})
	store.RefreshNow(context.Background(), "")
	st.snap = &proxy.Snapshot{Env: "env_admin", Policy: pol, Guard: st.snap.Guard, Limits: st.snap.Limits,
		Resolver: st.snap.Resolver, Injector: inject.New(pol, store)}
	st.snap.Prepare()
	t.Cleanup(st.snap.Close)
	h := admin.Handler(st, metrics.New(), true)
	for _, tc := range []struct {
		url, credHeaders, inject string
		unknown                  bool
	}{
		{"https://api.example.com/", "X-Api-Key,X-Second", "X-Api-Key,X-Trace,X-Second", false},
		{"https://goog.example.com/", "X-Goog-Api-Key", "X-Goog-Api-Key", false},
		{"https://gone.example.com/", "", "", true},
	} {
		res, body := serve(t, h, http.MethodGet, "/v1/explain?url="+url.QueryEscape(tc.url))
		var got explain.Result
		decodeJSON(t, res, body, &got)
		if strings.Join(got.CredentialHeaders, ",") != tc.credHeaders || strings.Join(got.Inject, ",") != tc.inject ||
			(got.CredentialUnknown != "") != tc.unknown || got.Credential == "" {
			t.Errorf("explain %s =\n%s\nwant credential_headers %q, inject %q, unknown %t", tc.url, body, tc.credHeaders, tc.inject, tc.unknown)
		}
		if strings.Contains(body, credSecret) || strings.Contains(body, telemetryKey) {
			t.Errorf("explain %s shows a value:\n%s", tc.url, body)
		}
	}
}

// TestHealthServesOnlyHealth: the health listener, which probes and Prometheus
// reach from beyond the pod, answers /healthz, /readyz and /metrics and nothing
// that reloads, explains or hands out the sandbox's placeholders.
func TestHealthServesOnlyHealth(t *testing.T) {
	h := admin.Health(newState(t), metrics.New())
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if res, _ := serve(t, h, http.MethodGet, path); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", path, res.StatusCode)
		}
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/v1/reload"}, {http.MethodGet, "/v1/explain?url=https://api.example.com/"},
		{http.MethodGet, "/v1/sandbox/env"}, {http.MethodGet, "/ca.pem"}, {http.MethodGet, "/.well-known/jwks.json"},
	} {
		if res, _ := serve(t, h, c.method, c.path); res.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s on the health listener = %d, want 404", c.method, c.path, res.StatusCode)
		}
	}
	// Without health, the admin handler leaves them to the health listener.
	if res, _ := serve(t, admin.Handler(newState(t), metrics.New(), false), http.MethodGet, "/metrics"); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on an admin listener without health = %d, want 404", res.StatusCode)
	}
}

// TestWithToken: with admin.token, every admin endpoint wants the Bearer token;
// a missing, wrong or differently-schemed one is 401 and reaches nothing; a token
// that cannot be read refuses everything.
func TestWithToken(t *testing.T) {
	reloads := 0
	st := newState(t)
	st.reload = func() (string, error) { reloads++; return "h", nil }
	token, tokenErr := []byte("s3cret-admin"), error(nil)
	h := admin.WithToken(admin.Handler(st, metrics.New(), true), func() ([]byte, error) { return token, tokenErr })
	do := func(auth, method, path string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, req)
		if strings.Contains(rec.Body.String(), string(token)) {
			t.Errorf("%s %s: the response shows the token", method, path)
		}
		return rec.Code
	}
	for _, auth := range []string{"", "Bearer wrong", "Basic czNjcmV0LWFkbWlu", "s3cret-admin", "Bearer s3cret-admi"} {
		for _, path := range []string{"/v1/sandbox/env", "/healthz", "/metrics"} {
			if code := do(auth, http.MethodGet, path); code != http.StatusUnauthorized {
				t.Errorf("Authorization %q GET %s = %d, want 401", auth, path, code)
			}
		}
		if code := do(auth, http.MethodPost, "/v1/reload"); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q POST /v1/reload = %d, want 401", auth, code)
		}
	}
	if reloads != 0 {
		t.Fatalf("%d reloads ran without the token", reloads)
	}
	if code := do("Bearer s3cret-admin", http.MethodPost, "/v1/reload"); code != http.StatusOK || reloads != 1 {
		t.Errorf("with the token: POST /v1/reload = %d, reloads %d; want 200 and 1", code, reloads)
	}
	tokenErr = errors.New("gone")
	if code := do("Bearer s3cret-admin", http.MethodGet, "/v1/sandbox/env"); code != http.StatusServiceUnavailable {
		t.Errorf("token unreadable: %d, want 503", code)
	}
}
