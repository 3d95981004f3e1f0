package inject

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// TestApplyGitHubApp: the minted token goes as Bearer on "api" entries and as HTTP Basic
// x-access-token on "git" ones, replacing the client's; either form is scrubbed from the
// response; without a token nothing is forwarded.
func TestApplyGitHubApp(t *testing.T) {
	in, p := githubInjector(t)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+ghToken))
	for i, want := range []string{"Bearer " + ghToken, basic} {
		h := http.Header{"Authorization": {"Basic c2FuZGJveDpndWVzcw=="}}
		res, err := in.Apply(p.Rules()[i], h, nil)
		if err != nil || len(h["Authorization"]) != 1 || h.Get("Authorization") != want {
			t.Fatalf("rule %d: %v, Authorization %d values, want %q", i, err, len(h["Authorization"]), want)
		}
		if got, _ := res.Scrub.String("echo " + ghToken + " " + basic); strings.Contains(got, ghToken) || strings.Contains(got, basic[6:]) {
			t.Errorf("rule %d: not scrubbed: %q", i, got)
		}
	}
	in.creds.(fakeCreds)["gh"] = credential.Value{ID: "gh", GitHubApp: &credential.GitHubApp{AppID: "1"}}
	if _, err := in.Apply(p.Rules()[1], http.Header{}, nil); !errors.Is(err, credential.ErrUnavailable) {
		t.Errorf("without a token: %v, want unavailable", err)
	}
}

// BenchmarkApplyGitHubGit is BenchmarkApply's request on a "github": "git" entry: the
// installation token re-encoded as HTTP Basic on every request.
func BenchmarkApplyGitHubGit(b *testing.B) {
	in, p := githubInjector(b)
	b.ReportAllocs()
	for b.Loop() {
		h := http.Header{"User-Agent": {"git/2.39"}, "Accept": {"*/*"}, "Authorization": {"Basic c2FuZGJveDpndWVzcw=="}}
		if _, err := in.Apply(p.Rules()[1], h, nil); err != nil {
			b.Fatal(err)
		}
	}
}

const ghToken = "ghs_PLANTEDtoken0123456789"

// githubInjector injects the github_app credential "gh" (token ghToken) on an "api" entry
// (rule 0) and a "git" one (rule 1).
func githubInjector(t testing.TB) (*Injector, *allowlist.Policy) {
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "api.github.test", Credential: "gh"},
		{Domain: "github.test", Credential: "gh", GitHub: allowlist.GitHubGit}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	creds := fakeCreds{"gh": {ID: "gh", GitHubApp: &credential.GitHubApp{AppID: "1"}, Headers: []credential.Header{{Name: "Authorization", Value: "Bearer " + ghToken}}}}
	return New(p, creds), p
}

func TestRevokesGitHubToken(t *testing.T) {
	for _, p := range []string{"/installation/token", "/installation/token/", "//installation//token", "/Installation/TOKEN",
		"/repos/../installation/token", "/api/v3/installation/token", "installation/token",
		"/installation/token.json", "/installation/token;x", "/installation/token.", "/installation/token ",
		"/installation/token\t", "/installation/token\x00", `/installation\token`, "/installation/tokens"} {
		if !RevokesGitHubToken(p) {
			t.Errorf("%q not recognised", p)
		}
	}
	for _, p := range []string{"/installation/repositories", "/repos/acme/installation/token", "/"} {
		if RevokesGitHubToken(p) {
			t.Errorf("%q refused", p)
		}
	}
}
