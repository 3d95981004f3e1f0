// Package githubstub is a stand-in GitHub on loopback for tests: an API that verifies App
// JWTs with the App's public key and mints installation tokens scoped as asked, answers
// repository calls only with a token it minted that is still valid, and a git smart-HTTP
// server (git's own http-backend) that serves a private repository only to HTTP Basic
// x-access-token:<valid token>. Both speak TLS with a leaf of the caller's CA.
package githubstub

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TokenPrefix starts every token the API mints (like GitHub's "ghs_"), so tests can look
// for any of them in logs and responses.
const TokenPrefix = "ghs_PLANTED"

// App is a GitHub App: its ID and RSA key.
type App struct {
	ID  string
	Key *rsa.PrivateKey
}

// NewApp generates an App with a fresh 2048-bit key.
func NewApp(t testing.TB, id string) *App {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &App{ID: id, Key: k}
}

// PEM is the private key as GitHub hands it out (PKCS#1).
func (a *App) PEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(a.Key)}))
}

// Mint is one token call the API answered with a token: what it asked for.
type Mint struct {
	Token        string
	Repositories []string
	Permissions  map[string]string
}

// API is the stand-in REST API of one installation.
type API struct {
	URL          string // https://<first name>:<port>
	Port         int
	app          *App
	installation string
	Lifetime     atomic.Int64 // of minted tokens, nanoseconds; default one hour
	Down         atomic.Bool  // answer token calls 500

	mu      sync.Mutex
	expiry  map[string]time.Time // token -> expiry
	mints   []Mint
	refused []string // why each refused token call was refused
	calls   []Call
	revoked int
}

// Call is one repository call: the Authorization it carried and whether that was a
// valid token then.
type Call struct {
	Auth  string
	Valid bool
}

// StartAPI serves the API of app's installation with a leaf for names (the first names
// the URL) until the test ends.
func StartAPI(t testing.TB, app *App, installation string, leaf tls.Certificate, names ...string) *API {
	a := &API{app: app, installation: installation, expiry: map[string]time.Time{}}
	a.Lifetime.Store(int64(time.Hour))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /app/installations/{id}/access_tokens", a.mint)
	mux.HandleFunc("GET /repos/{owner}/{repo}", a.repo)
	mux.HandleFunc("DELETE /installation/token", a.revoke)
	a.URL, a.Port = serveTLS(t, mux, leaf, names[0])
	return a
}

// serveTLS serves h with leaf on 127.0.0.1 until the test ends; it returns the URL that
// names the server by name, and the port.
func serveTLS(t testing.TB, h http.Handler, leaf tls.Certificate, name string) (string, int) {
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	return fmt.Sprintf("https://%s:%d", name, port), port
}

// verifyJWT checks the App JWT as GitHub does: RS256 by the App's key, issued by its ID,
// iat and exp present, exp in the future and at most ten minutes after iat and from now.
func (a *API) verifyJWT(r *http.Request) error {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return fmt.Errorf("no Bearer JWT")
	}
	var c jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(raw, &c, func(*jwt.Token) (any, error) { return &a.app.Key.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithIssuer(a.app.ID), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	switch {
	case err != nil:
		return err
	case c.IssuedAt == nil:
		return fmt.Errorf("no iat")
	case c.ExpiresAt.Sub(c.IssuedAt.Time) > 10*time.Minute || time.Until(c.ExpiresAt.Time) > 10*time.Minute:
		return fmt.Errorf("exp too far")
	}
	return nil
}

func (a *API) mint(w http.ResponseWriter, r *http.Request) {
	var ask struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}
	err := a.verifyJWT(r)
	if err == nil && r.PathValue("id") != a.installation {
		err = fmt.Errorf("installation %s", r.PathValue("id"))
	}
	if err == nil {
		err = json.NewDecoder(r.Body).Decode(&ask)
	}
	if err != nil {
		a.refuse(w, http.StatusUnauthorized, err.Error())
		return
	}
	if a.Down.Load() {
		a.refuse(w, http.StatusInternalServerError, "down")
		return
	}
	a.mu.Lock()
	tok := fmt.Sprintf("%s_%d_%s", TokenPrefix, len(a.mints)+1, rand.Text())
	exp := time.Now().Add(time.Duration(a.Lifetime.Load()))
	a.expiry[tok] = exp
	a.mints = append(a.mints, Mint{Token: tok, Repositories: ask.Repositories, Permissions: ask.Permissions})
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_at": exp.UTC().Format(time.RFC3339Nano),
		"permissions": ask.Permissions, "repository_selection": "selected"})
}

func (a *API) refuse(w http.ResponseWriter, code int, why string) {
	a.mu.Lock()
	a.refused = append(a.refused, why)
	a.mu.Unlock()
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"message": %q}`, why)
}

// Valid reports whether tok is a token the API minted that has not expired.
func (a *API) Valid(tok string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.expiry[tok]
	return ok && time.Now().Before(exp)
}

// Mints returns the token calls answered with a token, in order.
func (a *API) Mints() []Mint {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.mints)
}

// Refused returns why each refused token call was refused.
func (a *API) Refused() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.refused)
}

// Calls returns the repository calls, in order.
func (a *API) Calls() []Call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// repo answers GET /repos/{owner}/{repo} for a repository the token was minted for, and
// echoes the Authorization it got (as an upstream that reflects requests would).
func (a *API) repo(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	tok, _ := strings.CutPrefix(auth, "Bearer ")
	valid := a.Valid(tok)
	a.mu.Lock()
	a.calls = append(a.calls, Call{Auth: auth, Valid: valid})
	a.mu.Unlock()
	if !valid || !slices.Contains(a.repos(tok), r.PathValue("repo")) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"message": "Not Found", "echo": %q}`, auth)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	name := r.PathValue("owner") + "/" + r.PathValue("repo")
	json.NewEncoder(w).Encode(map[string]any{"id": 1, "name": r.PathValue("repo"), "full_name": name,
		"private": true, "url": a.URL + "/repos/" + name, "description": "you sent " + auth})
}

// revoke is DELETE /installation/token: the token that authenticates it stops working.
func (a *API) revoke(w http.ResponseWriter, r *http.Request) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.expiry[tok]; !ok {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	a.expiry[tok] = time.Time{}
	a.revoked++
	w.WriteHeader(http.StatusNoContent)
}

// Revoked is how many tokens were revoked.
func (a *API) Revoked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.revoked
}

// repos are the repositories tok was minted for.
func (a *API) repos(tok string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range a.mints {
		if m.Token == tok {
			return m.Repositories
		}
	}
	return nil
}
