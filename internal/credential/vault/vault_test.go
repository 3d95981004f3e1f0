package vault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// planted is a secret value: no error, log line, version or rendering may contain it.
const planted = "PLANTED-s3cr3t-v4lue"

func TestFormat(t *testing.T) {
	for _, c := range []struct{ format, value, want string }{
		{"Bearer {}", "t0k", "Bearer t0k"},
		{"{}", "k", "k"},
		{"token {} suffix", "x", "token x suffix"},
		{"Bearer {}", "has{}braces", "Bearer has{}braces"}, // the value is not expanded again
	} {
		if got := format(c.format, c.value); got != c.want {
			t.Errorf("format(%q, %q) = %q, want %q", c.format, c.value, got, c.want)
		}
	}
}

func TestPathDefaultsAndChecks(t *testing.T) {
	p, err := Path{Path: "/identity/oidc/token/agent/"}.withDefaults("oidc")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Path{Path: "identity/oidc/token/agent", Field: "token", Header: "Authorization", Format: "Bearer {}"}); p != want {
		t.Errorf("defaults: got %+v, want %+v", p, want)
	}
	for _, bad := range []Path{{}, {Path: "a/b", Format: "Bearer"}, {Path: "a/b", Format: "{}{}"}} {
		if _, err := bad.withDefaults("x"); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestKVVersion(t *testing.T) {
	for _, c := range []struct {
		meta map[string]any
		want string // "" = error
	}{
		{map[string]any{"version": jsonNumber("3")}, "3"},
		{map[string]any{"version": float64(12)}, "12"},
		{map[string]any{"version": "5"}, "5"},
		{map[string]any{"version": 7}, "7"},
		{map[string]any{"version": float64(1.5)}, ""},
		{map[string]any{"version": jsonNumber("0")}, ""},
		{map[string]any{"version": "x"}, ""},
		{map[string]any{}, ""},
		{nil, ""},
	} {
		got, err := kvVersion(c.meta)
		if c.want == "" && err == nil || c.want != "" && got != c.want {
			t.Errorf("kvVersion(%v) = %q, %v; want %q", c.meta, got, err, c.want)
		}
	}
}

func TestDescribeNeverShowsWhatWasSentOrARawBody(t *testing.T) {
	echo := &api.ResponseError{HTTPMethod: "PUT", URL: "http://127.0.0.1/v1/auth/approle/login", StatusCode: 400,
		Errors: []string{"invalid secret id " + planted}}
	err := describe("login", "auth/approle/login", echo, planted)
	if strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("echoed value: %v", err)
	}
	raw := &api.ResponseError{StatusCode: 502, RawError: true, Errors: []string{"<html>" + planted + "</html>"}}
	if err := describe("read", "secret/data/x", raw); strings.Contains(err.Error(), planted) || !hasStatus(err, 502) {
		t.Errorf("raw body: %v", err)
	}
	if err := describe("read", "p", fmt.Errorf("dial: %s", planted), planted); strings.Contains(err.Error(), planted) {
		t.Errorf("transport error: %v", err)
	}
}

func TestVersionIsKeyedAndStable(t *testing.T) {
	a, b := newLeases([32]byte{1}), newLeases([32]byte{2})
	va := a.version(planted)
	if va != a.version(planted) || va == a.version(planted+"2") || va == b.version(planted) {
		t.Errorf("versions: %s %s %s %s", va, a.version(planted), a.version(planted+"2"), b.version(planted))
	}
	if strings.Contains(va, planted) || !strings.HasPrefix(va, "hmac:") || len(va) != len("hmac:")+16 {
		t.Errorf("version %q", va)
	}
}

func TestTokenAuthRedactsItself(t *testing.T) {
	a := NewTokenAuth(planted, "")
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if s := fmt.Sprintf(verb, a); strings.Contains(s, planted) || strings.Contains(s, fmt.Sprintf("%x", planted)) {
			t.Errorf("%s shows the token: %s", verb, s)
		}
	}
}

// newTestBackend returns a Backend on f's Vault with the token method on a token file
// holding "root-token".
func newTestBackend(t *testing.T, f *fakeVault, o Options) (*Backend, *syncBuffer) {
	t.Helper()
	log := &syncBuffer{}
	if o.Auth == nil {
		o.Auth = NewTokenAuth("", writeFile(t, "token", "root-token"))
	}
	o.Address, o.Log = f.srv.URL, zerolog.New(log).Level(zerolog.DebugLevel)
	if o.LoginBackoff == 0 {
		o.LoginBackoff = 50 * time.Millisecond
	}
	t.Setenv("VAULT_MAX_RETRIES", "0") // fake failures are final: no retry waits
	b, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(log.String(), planted) {
			t.Errorf("the log shows a secret:\n%s", log)
		}
	})
	return b, log
}

func TestReadKV(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	f.kv("egressd/credentials/api", 7, map[string]any{"token": planted})
	f.kv("egressd/credentials/shape", 2, map[string]any{"tokn": planted})
	f.json("GET /v1/secret/data/egressd/credentials/deleted", 404, map[string]any{"data": map[string]any{
		"data": nil, "metadata": map[string]any{"version": 3, "deletion_time": "2026-01-01T00:00:00Z", "destroyed": false}}})
	f.json("GET /v1/secret/data/egressd/credentials/destroyed", 404, map[string]any{"data": map[string]any{
		"data": nil, "metadata": map[string]any{"version": 3, "destroyed": true}}})
	f.json("GET /v1/secret/data/egressd/credentials/denied", 403, map[string]any{"errors": []string{"permission denied"}})
	f.handle("GET /v1/secret/data/egressd/credentials/broken", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(502)
		w.Write([]byte("<html>upstream said " + planted + "</html>"))
	})
	b, _ := newTestBackend(t, f, Options{})
	ctx := context.Background()

	sec, v, err := b.Read(ctx, "api")
	h := sec.Headers
	if err != nil || v != "7" || len(h) != 1 || h[0].Name != "Authorization" || h[0].Value != "Bearer "+planted {
		t.Fatalf("api: %v %q %v", h, v, err)
	}
	if got := f.requestsTo("/secret/data/egressd/credentials/api"); len(got) != 1 || got[0].token != "root-token" {
		t.Errorf("the read did not carry the token from the file: %+v", got)
	}

	for id, want := range map[string]error{
		"shape": credential.ErrInvalid, "deleted": credential.ErrNotFound, "destroyed": credential.ErrNotFound,
		"missing": credential.ErrNotFound, "denied": nil, "broken": nil,
	} {
		_, _, err := b.Read(ctx, id)
		switch {
		case err == nil:
			t.Errorf("%s: no error", id)
		case strings.Contains(err.Error(), planted):
			t.Errorf("%s: the error shows the secret: %v", id, err)
		case want != nil && !errors.Is(err, want):
			t.Errorf("%s: %v, want %v", id, err, want)
		case want == nil && (errors.Is(err, credential.ErrNotFound) || errors.Is(err, credential.ErrInvalid)):
			t.Errorf("%s: %v is not a plain failed read", id, err)
		case id == "shape" && !strings.Contains(err.Error(), "shape"):
			t.Errorf("shape: the error does not name the credential: %v", err)
		}
	}
	// A 403 makes the backend look its token up; a token that looks up fine is kept.
	if n := len(f.requestsTo("/auth/token/lookup-self")); n != 2 {
		t.Errorf("%d token lookups, want 2 (login, and the check after the 403)", n)
	}
}

func TestKubernetesLogin(t *testing.T) {
	f := newFakeVault(t)
	f.json("PUT /v1/auth/k8s/login", 200, map[string]any{"auth": map[string]any{
		"client_token": "k8s-client-token", "lease_duration": 3600, "renewable": true}})
	f.kv("egressd/credentials/api", 1, map[string]any{"token": "t"})
	jwtFile := writeFile(t, "sa-token", "header.payload.sig\n")
	b, log := newTestBackend(t, f, Options{Auth: NewKubernetesAuth("k8s", "egressd", jwtFile)})
	if _, _, err := b.Read(context.Background(), "api"); err != nil {
		t.Fatal(err)
	}
	logins := f.requestsTo("/auth/k8s/login")
	if len(logins) != 1 || logins[0].body["role"] != "egressd" || logins[0].body["jwt"] != "header.payload.sig" || logins[0].token != "" {
		t.Errorf("login requests: %+v", logins)
	}
	if r := f.requestsTo("/secret/data/egressd/credentials/api"); len(r) != 1 || r[0].token != "k8s-client-token" {
		t.Errorf("reads: %+v", r)
	}
	if strings.Contains(log.String(), "k8s-client-token") || strings.Contains(log.String(), "header.payload.sig") {
		t.Errorf("the log shows a token:\n%s", log)
	}

	// A refused login is an error without the JWT, even when Vault echoes it.
	f.json("PUT /v1/auth/k8s/login", 400, map[string]any{"errors": []string{"bad jwt " + planted}})
	os.WriteFile(jwtFile, []byte(planted), 0o600)
	_, err := NewKubernetesAuth("k8s", "egressd", jwtFile).Login(context.Background(), b.client)
	if err == nil || strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "HTTP 400") {
		t.Errorf("refused login: %v", err)
	}
}

// newStore starts a Store over b that never refreshes on its own (Refresh 1h): only the
// backend's WatchIDs makes it read again.
func newStore(t *testing.T, b credential.Backend, ids ...string) *credential.Store {
	t.Helper()
	s := credential.NewStore(b, ids, credential.Options{Refresh: time.Hour, MaxStale: 3 * time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	t.Cleanup(func() { cancel(); s.Wait() })
	return s
}

// eventually polls cond every 20ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func TestLeasedPathIsRenewedThenReadAgain(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	var mu sync.Mutex
	lease := 0
	f.handle("GET /v1/db/creds/agent", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		lease++
		n := lease
		mu.Unlock()
		fmt.Fprintf(w, `{"lease_id":"db/creds/agent/%d","lease_duration":1,"renewable":true,"data":{"api_key":"%s-%d"}}`, n, planted, n)
	})
	f.json("PUT /v1/sys/leases/renew", 200, map[string]any{"lease_id": "db/creds/agent/1", "lease_duration": 1, "renewable": true})
	b, _ := newTestBackend(t, f, Options{Paths: map[string]Path{"db": {Path: "db/creds/agent", Field: "api_key", Header: "X-Api-Key", Format: "{}"}}})
	s := newStore(t, b, "db")
	v, err := s.Get("db")
	if err != nil || v.Version != "db/creds/agent/1" || v.Headers[0].Name != "X-Api-Key" || v.Headers[0].Value != planted+"-1" {
		t.Fatalf("first read: %v %v", v, err)
	}
	// At 2/3 of the lease the backend renews it: same value, same version, no new read.
	eventually(t, 3*time.Second, "a lease renewal", func() bool { return len(f.requestsTo("/sys/leases/renew")) >= 2 })
	if r := f.requestsTo("/db/creds/agent"); len(r) != 1 {
		t.Errorf("%d reads of the path while the lease was renewable, want 1", len(r))
	}
	if body := f.requestsTo("/sys/leases/renew")[0].body; body["lease_id"] != "db/creds/agent/1" {
		t.Errorf("renewal body %v", body)
	}
	// Once Vault refuses the renewal (revoked, max TTL), the path is read again: a new lease.
	f.json("PUT /v1/sys/leases/renew", 400, map[string]any{"errors": []string{"lease not found"}})
	took := eventually(t, 3*time.Second, "a new lease", func() bool {
		v, err := s.Get("db")
		return err == nil && v.Version == "db/creds/agent/2"
	})
	t.Logf("new lease in memory %v after renewals stopped", took)
	if v, _ := s.Get("db"); v.Headers[0].Value != planted+"-2" {
		t.Errorf("after the new lease: %v", v)
	}
}

func TestIdentityTokenReadAgainBeforeItsTTL(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	var mu sync.Mutex
	n := 0
	f.handle("GET /v1/identity/oidc/token/agent", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		fmt.Fprintf(w, `{"data":{"client_id":"c","token":"jwt-%d","ttl":1}}`, k)
	})
	b, _ := newTestBackend(t, f, Options{Paths: map[string]Path{"oidc": {Path: "identity/oidc/token/agent"}}})
	s := newStore(t, b, "oidc")
	first, err := s.Get("oidc")
	if err != nil || first.Headers[0].Value != "Bearer jwt-1" || !strings.HasPrefix(first.Version, "hmac:") {
		t.Fatalf("first: %v %v", first, err)
	}
	// Reads in between are served from memory: no new token is minted.
	if _, _, err := b.Read(context.Background(), "oidc"); err != nil || len(f.requestsTo("/identity/oidc/token/agent")) != 1 {
		t.Errorf("a read before the refresh time went to Vault: %v", err)
	}
	took := eventually(t, 2*time.Second, "a new identity token", func() bool {
		v, err := s.Get("oidc")
		return err == nil && v.Headers[0].Value == "Bearer jwt-2"
	})
	if took > 900*time.Millisecond {
		t.Errorf("the new token came %v after the first, want about 2/3 of its 1s TTL", took)
	}
	if v, _ := s.Get("oidc"); v.Version == first.Version {
		t.Errorf("the version did not change: %s", v.Version)
	}
}

func TestPathWrongShapeNamesTheCredentialNotTheValue(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	f.json("GET /v1/some/path", 200, map[string]any{"data": map[string]any{"secret": planted}})
	f.json("GET /v1/some/number", 200, map[string]any{"data": map[string]any{"token": 42}})
	f.json("GET /v1/some/crlf", 200, map[string]any{"data": map[string]any{"token": planted + "\r\nX-Evil: 1"}})
	b, _ := newTestBackend(t, f, Options{Paths: map[string]Path{
		"p1": {Path: "some/path"}, "p2": {Path: "some/number"}, "p3": {Path: "some/crlf"}, "p4": {Path: "some/missing"},
	}})
	for id, want := range map[string]error{"p1": credential.ErrInvalid, "p2": credential.ErrInvalid, "p3": credential.ErrInvalid, "p4": credential.ErrNotFound} {
		_, _, err := b.Read(context.Background(), id)
		if !errors.Is(err, want) || strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), id) && want == credential.ErrInvalid {
			t.Errorf("%s: %v", id, err)
		}
	}
}

func TestLoginFailureAtStartIsRetried(t *testing.T) {
	f := newFakeVault(t)
	f.json("PUT /v1/auth/approle/login", 400, map[string]any{"errors": []string{"invalid role or secret ID"}})
	f.kv("egressd/credentials/api", 1, map[string]any{"token": "t"})
	auth := NewAppRoleAuth("", writeFile(t, "role-id", "r"), writeFile(t, "secret-id", planted))
	b, log := newTestBackend(t, f, Options{Auth: auth, LoginBackoff: 100 * time.Millisecond})
	s := newStore(t, b, "api")
	if _, err := s.Get("api"); !errors.Is(err, credential.ErrUnavailable) || strings.Contains(err.Error(), planted) {
		t.Fatalf("with the login refused: %v", err)
	}
	if st := s.Status()["api"]; st.Ready || !strings.HasPrefix(st.Error, credential.CauseNeverRead) {
		t.Errorf("status %+v", st)
	}
	f.json("PUT /v1/auth/approle/login", 200, map[string]any{"auth": map[string]any{"client_token": "c", "lease_duration": 0}})
	// The backend retries the login on its own and then has the Store read every ID again.
	took := eventually(t, 3*time.Second, "recovery", func() bool { _, err := s.Get("api"); return err == nil })
	t.Logf("recovered %v after the login was accepted; log:\n%s", took, log)
	if logins := f.requestsTo("/auth/approle/login"); logins[0].body["secret_id"] != planted || logins[0].body["role_id"] != "r" {
		t.Errorf("login body %v", logins[0].body)
	}
}

func TestTokenFileChangeIsPickedUp(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	f.kv("egressd/credentials/api", 1, map[string]any{"token": "t"})
	file := writeFile(t, "token", "token-1")
	b, _ := newTestBackend(t, f, Options{Auth: NewTokenAuth("", file)})
	s := credential.NewStore(b, []string{"api"}, credential.Options{Refresh: 50 * time.Millisecond, MaxStale: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	defer func() { cancel(); s.Wait() }()
	os.WriteFile(file, []byte("token-2\n"), 0o600)
	eventually(t, 3*time.Second, "reads with the new token", func() bool {
		r := f.requestsTo("/secret/data/egressd/credentials/api")
		return r[len(r)-1].token == "token-2"
	})
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type syncBuffer = syncbuf.Buffer

func jsonNumber(s string) any { return json.Number(s) }
