package vault

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/egressd/egressd/internal/credential"
)

// canary is an origin the Vault client must never reach: it counts requests and keeps
// every X-Vault-Token and body it was sent.
type canary struct {
	*httptest.Server
	mu       sync.Mutex
	requests int
	tokens   []string
}

func newCanary(t *testing.T) *canary {
	c := &canary{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.requests++
		c.tokens = append(c.tokens, r.Header.Get("X-Vault-Token"))
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data": {"data": {"token": "from-the-canary"}, "metadata": {"version": 1}}}`))
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *canary) seen() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, c.tokens
}

// redirectingFront stands where the Vault address points and answers every request with
// status and a Location on target (same path and query). It counts what it answers.
func redirectingFront(t *testing.T, status int, target string) (*httptest.Server, *int) {
	var mu sync.Mutex
	n := new(int)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*n++
		mu.Unlock()
		http.Redirect(w, r, target+r.URL.RequestURI(), status)
	}))
	t.Cleanup(s.Close)
	return s, n
}

// TestVaultRedirectToAnotherOriginRefused: the Vault address answers 301, 302, 307 or
// 308 to another origin (a canary). The client follows none of them: the canary sees no
// request and no token, for a token read and for an AppRole login (whose secret ID would
// travel too), and the credential is unavailable (credential_unavailable) with an error
// that says why.
func TestVaultRedirectToAnotherOriginRefused(t *testing.T) {
	t.Parallel()
	v, mount, roleID, secretID := appRoleVault(t)
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		c := newCanary(t)
		front, answered := redirectingFront(t, status, c.URL)
		for name, auth := range map[string]AuthMethod{
			"token":   NewTokenAuth("", v.childToken("1h")),
			"approle": NewAppRoleAuth(mount, roleID, secretID),
		} {
			r := v.start(Options{Address: front.URL, Auth: auth}, credential.Options{}, "api")
			_, err := r.s.Get("api")
			var unavailable *credential.UnavailableError
			if !errors.As(err, &unavailable) {
				t.Errorf("%d, %s: Get = %v, want a *credential.UnavailableError", status, name, err)
			}
			if !strings.Contains(r.log.String(), "egressd never follows Vault redirects") {
				t.Errorf("%d, %s: the log does not say the redirect was refused:\n%s", status, name, r.log)
			}
		}
		if n, tokens := c.seen(); n != 0 || len(tokens) != 0 {
			t.Errorf("%d: the canary saw %d requests, %d with a Vault token; want none", status, n, nonEmpty(tokens))
		}
		if *answered == 0 {
			t.Errorf("%d: the front was never asked: the test proves nothing", status)
		}
	}
}

// TestVaultBehindSameOriginFront: a front that proxies to Vault (one origin from the
// client's side) still serves the credential.
func TestVaultBehindSameOriginFront(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	target, err := url.Parse(v.addr)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(httputil.NewSingleHostReverseProxy(target))
	t.Cleanup(front.Close)
	r := v.start(Options{Address: front.URL, Auth: NewTokenAuth("", v.childToken("1h"))}, credential.Options{}, "api")
	if h, err := r.header("api"); err != nil || h != "Bearer "+planted {
		t.Errorf("through a proxying front: %q, %v; want the credential", h, err)
	}
}

func nonEmpty(ss []string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}
