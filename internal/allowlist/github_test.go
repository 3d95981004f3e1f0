package allowlist

import (
	"errors"
	"strings"
	"testing"
)

func TestCompileGitHubMode(t *testing.T) {
	p, err := Compile([]Entry{{Domain: "api.github.com", Credential: "gh"}, {Domain: "github.com", Credential: "gh", GitHub: "git"},
		{Domain: "uploads.github.com", Credential: "gh", GitHub: "api"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{GitHubAPI, GitHubGit, GitHubAPI} {
		if got := p.Rules()[i].GitHub; got != want {
			t.Errorf("rule %d: github %q, want %q", i, got, want)
		}
	}
	_, err = Compile([]Entry{{Domain: "github.com", Credential: "gh", GitHub: "ssh"}, {Domain: "a.test", GitHub: "git"}}, Options{})
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Problems) != 2 {
		t.Fatalf("err = %v, want two problems", err)
	}
	for i, want := range []string{`unknown value "ssh"; use "api"`, `add "credential" or remove "github"`} {
		if p := ce.Problems[i]; p.Index != i || p.Field != "github" || !strings.Contains(p.Msg, want) {
			t.Errorf("problem %d = %+v, want %q", i, p, want)
		}
	}
}
