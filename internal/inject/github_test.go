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
	const tok = "ghs_PLANTEDtoken0123456789"
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "api.github.test", Credential: "gh"},
		{Domain: "github.test", Credential: "gh", GitHub: allowlist.GitHubGit}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	app := &credential.GitHubApp{AppID: "1"}
	creds := fakeCreds{"gh": {ID: "gh", GitHubApp: app, Headers: []credential.Header{{Name: "Authorization", Value: "Bearer " + tok}}}}
	in := New(p, creds)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+tok))
	for i, want := range []string{"Bearer " + tok, basic} {
		h := http.Header{"Authorization": {"Basic c2FuZGJveDpndWVzcw=="}}
		res, err := in.Apply(p.Rules()[i], h, nil)
		if err != nil || len(h["Authorization"]) != 1 || h.Get("Authorization") != want {
			t.Fatalf("rule %d: %v, Authorization %d values, want %q", i, err, len(h["Authorization"]), want)
		}
		if got, _ := res.Scrub.String("echo " + tok + " " + basic); strings.Contains(got, tok) || strings.Contains(got, basic[6:]) {
			t.Errorf("rule %d: not scrubbed: %q", i, got)
		}
	}
	creds["gh"] = credential.Value{ID: "gh", GitHubApp: app}
	if _, err := in.Apply(p.Rules()[1], http.Header{}, nil); !errors.Is(err, credential.ErrUnavailable) {
		t.Errorf("without a token: %v, want unavailable", err)
	}
}
