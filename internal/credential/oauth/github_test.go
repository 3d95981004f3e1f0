package oauth

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/testutil/githubstub"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// ghRig is a rig whose one credential, "gh", is a github_app of a stand-in API.
type ghRig struct {
	*rig
	api *githubstub.API
}

// newGHRig starts the stand-in API (tokens living lifetime) and a rig over a github_app
// credential for it; open are the prefixes the token call's guard opens.
func newGHRig(t testing.TB, lifetime time.Duration, repos []string, open ...netip.Prefix) *ghRig {
	ca := testpki.New(t)
	app := githubstub.NewApp(t, "4242")
	api := githubstub.StartAPI(t, app, "77", ca.Leaf(t, "127.0.0.1"), "127.0.0.1")
	api.Lifetime.Store(int64(lifetime))
	secret, err := json.Marshal(map[string]any{"type": "github_app", "app_id": 4242, "installation_id": "77",
		"private_key": app.PEM(), "repositories": repos, "permissions": map[string]string{"contents": "read"}, "api_url": api.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := startRig(t, "", "", guardedClient(t, ca.Pool, open...), map[string]string{"gh": string(secret)}, false)
	return &ghRig{rig: r, api: api}
}

var loopback = netip.MustParsePrefix("127.0.0.0/8")

// TestGitHubAppMintsScopedToken: the App JWT verifies with the App's public key, the
// token is asked for exactly the credential's repositories and permissions, and Get
// serves it as a Bearer token.
func TestGitHubAppMintsScopedToken(t *testing.T) {
	t.Parallel()
	g := newGHRig(t, time.Hour, []string{"docs", "api-server"}, loopback)
	h, err := g.header("gh")
	if err != nil {
		t.Fatal(err)
	}
	mints := g.api.Mints()
	if len(mints) != 1 || h != "Bearer "+mints[0].Token {
		t.Fatalf("served %q after %d mints, refused %v", h, len(mints), g.api.Refused())
	}
	if !slices.Equal(mints[0].Repositories, []string{"api-server", "docs"}) || len(mints[0].Permissions) != 1 ||
		mints[0].Permissions["contents"] != "read" {
		t.Errorf("asked for %v %v, want [api-server docs] {contents: read}", mints[0].Repositories, mints[0].Permissions)
	}
	if g.count("gh", ResultOK) != 1 {
		t.Errorf("mint ok = %d, want 1", g.count("gh", ResultOK))
	}
}

// TestGitHubAppRefreshedAhead: tokens living 3 s are replaced before they expire; every
// token Get serves is one the API still holds valid, and a second one is served after
// the first expired.
func TestGitHubAppRefreshedAhead(t *testing.T) {
	t.Parallel()
	g := newGHRig(t, 3*time.Second, []string{"docs"}, loopback)
	first, err := g.header("gh")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		h, err := g.header("gh")
		if err != nil {
			t.Fatalf("no token at %v: %v", time.Now(), err)
		}
		if tok := strings.TrimPrefix(h, "Bearer "); !g.api.Valid(tok) {
			t.Fatalf("served a token the API no longer accepts")
		}
		served[h] = true
	}
	if len(served) < 2 || !served[first] {
		t.Errorf("served %d tokens, want the first and a refreshed one", len(served))
	}
}

// TestGitHubAppEndpointDown: with the token endpoint failing, the last token serves until
// it expires, never after; then credential_unavailable (no_access_token).
func TestGitHubAppEndpointDown(t *testing.T) {
	t.Parallel()
	g := newGHRig(t, 100*time.Second, []string{"docs"}, loopback)
	first, err := g.header("gh")
	if err != nil {
		t.Fatal(err)
	}
	g.api.Down.Store(true)
	now := time.Now().Add(90 * time.Second) // past the refresh point, before expiry
	g.now.Store(&now)
	eventually(t, "a failed mint", func() bool { return g.count("gh", ResultError) > 0 })
	if h, err := g.header("gh"); err != nil || h != first {
		t.Errorf("before expiry: %v, want the last token", err)
	}
	later := time.Now().Add(96 * time.Second) // within the skew before expiry: not sent
	g.now.Store(&later)
	_, err = g.m.Get("gh")
	var ue *credential.UnavailableError
	if !errors.As(err, &ue) || ue.Cause != credential.CauseNoAccessToken {
		t.Fatalf("after expiry: %v, want no_access_token", err)
	}
	eventually(t, "the failure line", func() bool {
		return strings.Contains(g.log.String(), "github_app token refresh failed") && strings.Contains(g.log.String(), "500 Internal Server Error")
	})
}

// TestGitHubAppTokenCallGuarded: the token endpoint on loopback, which the guard does not
// open, gets no connection at all; the credential is unavailable, not served unscoped.
func TestGitHubAppTokenCallGuarded(t *testing.T) {
	t.Parallel()
	g := newGHRig(t, time.Hour, []string{"docs"})
	_, err := g.m.Get("gh")
	var ue *credential.UnavailableError
	if !errors.As(err, &ue) || ue.Cause != credential.CauseNoAccessToken {
		t.Fatalf("Get: %v, want no_access_token", err)
	}
	g.settle(t, "gh")
	if n := len(g.api.Mints()) + len(g.api.Refused()); n != 0 {
		t.Errorf("the token endpoint got %d calls through a guard that refuses loopback", n)
	}
	if g.count("gh", ResultError) < 1 {
		t.Error("the refused call was not counted")
	}
}

// TestGitHubAppNarrowedDropsToken: once the repositories change, the token minted for the
// old ones is never served again, even while no new one can be minted.
func TestGitHubAppNarrowedDropsToken(t *testing.T) {
	t.Parallel()
	g := newGHRig(t, time.Hour, []string{"docs", "api-server"}, loopback)
	wide, err := g.header("gh")
	if err != nil {
		t.Fatal(err)
	}
	g.api.Down.Store(true)
	g.rewrite(t, `"docs","api-server"`, `"docs"`)
	eventually(t, "the failed mint for [docs]", func() bool { return g.count("gh", ResultError) > 0 })
	if h, err := g.header("gh"); err == nil {
		t.Fatalf("served %v after the repositories narrowed and no mint succeeded", h == wide)
	}
	g.api.Down.Store(false)
	now := time.Now().Add(5 * time.Minute) // past the back-off
	g.now.Store(&now)
	eventually(t, "a token for [docs]", func() bool {
		m := g.api.Mints()
		h, _ := g.header("gh")
		return len(m) == 2 && slices.Equal(m[1].Repositories, []string{"docs"}) && h == "Bearer "+m[1].Token
	})
}

// rewrite replaces old by new in the credentials file, atomically.
func (r *rig) rewrite(t *testing.T, old, new string) {
	b, err := os.ReadFile(r.path)
	if err != nil || !strings.Contains(string(b), old) {
		t.Fatalf("rewrite: %v, or no %q", err, old)
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Replace(string(b), old, new, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkGetGitHubApp is the per-request cost of a github_app credential (the cached
// installation token), beside BenchmarkGet's plain and oauth2 ones.
func BenchmarkGetGitHubApp(b *testing.B) {
	g := newGHRig(b, time.Hour, []string{"docs"}, loopback)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.m.Get("gh"); err != nil {
			b.Fatal(err)
		}
	}
}
