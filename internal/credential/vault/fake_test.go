package vault

import (
	"encoding/json"
	"github.com/rs/zerolog"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeVault is a Vault HTTP API on 127.0.0.1 that answers the paths a test scripts, for
// what the dev server cannot do (Kubernetes auth, leased secrets, broken responses).
// Unscripted paths get 404. Each request is recorded with its token and JSON body.
type fakeVault struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	routes   map[string]http.HandlerFunc // "GET /v1/secret/data/x"
	requests []fakeRequest
}

type fakeRequest struct {
	method, path, token string
	body                map[string]any
}

func newFakeVault(t *testing.T) *fakeVault {
	f := &fakeVault{t: t, routes: map[string]http.HandlerFunc{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVault) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := fakeRequest{method: r.Method, path: r.URL.Path, token: r.Header.Get("X-Vault-Token")}
	_ = json.Unmarshal(body, &req.body)
	f.mu.Lock()
	f.requests = append(f.requests, req)
	h := f.routes[r.Method+" "+r.URL.Path]
	f.mu.Unlock()
	if h == nil {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"errors":[]}`)
		return
	}
	h(w, r)
}

// handle scripts method+path ("GET /v1/secret/data/x").
func (f *fakeVault) handle(route string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[route] = h
}

// json scripts a fixed JSON answer.
func (f *fakeVault) json(route string, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		f.t.Fatal(err)
	}
	f.handle(route, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(b)
	})
}

func (f *fakeVault) requestsTo(path string) []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeRequest
	for _, r := range f.requests {
		if strings.HasSuffix(r.path, path) {
			out = append(out, r)
		}
	}
	return out
}

// staticToken scripts lookup-self for a non-expiring token.
func (f *fakeVault) staticToken() {
	f.json("GET /v1/auth/token/lookup-self", 200, map[string]any{"data": map[string]any{"ttl": 0, "renewable": false, "accessor": "acc"}})
}

// kv scripts a KV v2 read of path (under secret/data/) returning data at version.
func (f *fakeVault) kv(path string, version int, data map[string]any) {
	f.json("GET /v1/secret/data/"+path, 200, map[string]any{"data": map[string]any{
		"data": data, "metadata": map[string]any{"version": version, "destroyed": false},
	}})
}

// Test logs carry milliseconds, so that a failure's log shows the order of renewals,
// logins and reads.
func init() { zerolog.TimeFieldFormat = "15:04:05.000" }
