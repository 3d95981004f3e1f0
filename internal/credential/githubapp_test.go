package credential

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/testutil/githubstub"
)

// appSecret is a valid github_app secret with key, changed by set (nil deletes a key).
func appSecret(key string, set map[string]any) map[string]any {
	raw := map[string]any{"type": "github_app", "app_id": "123", "installation_id": float64(456), "private_key": key,
		"repositories": []any{"docs", "api-server"}, "permissions": map[string]any{"contents": "read"}}
	for k, v := range set {
		if v == nil {
			delete(raw, k)
		} else {
			raw[k] = v
		}
	}
	return raw
}

func TestParseGitHubApp(t *testing.T) {
	app := githubstub.NewApp(t, "123")
	s, err := Parse("gh", appSecret(app.PEM(), nil))
	if err != nil {
		t.Fatal(err)
	}
	g := s.GitHubApp
	if s.Type != TypeGitHubApp || g == nil || g.AppID != "123" || g.InstallationID != "456" || !g.PrivateKey.Equal(app.Key) ||
		!slices.Equal(g.Repositories, []string{"api-server", "docs"}) || !maps.Equal(g.Permissions, map[string]string{"contents": "read"}) {
		t.Fatalf("parsed %v", g)
	}
	if g.TokenURL() != "https://api.github.com/app/installations/456/access_tokens" {
		t.Errorf("token URL %s", g.TokenURL())
	}
	if len(s.Headers) != 0 {
		t.Error("a github_app secret sets headers of its own")
	}
	ghes, err := Parse("gh", appSecret(app.PEM(), map[string]any{"api_url": "https://ghe.example.com/api/v3/"}))
	if err != nil || ghes.GitHubApp.TokenURL() != "https://ghe.example.com/api/v3/app/installations/456/access_tokens" {
		t.Errorf("GHES: %v", err)
	}
}

// TestParseGitHubAppRejects: every bad field is refused with its fix, and never with the key.
func TestParseGitHubAppRejects(t *testing.T) {
	key := githubstub.NewApp(t, "123").PEM()
	tests := []struct {
		name string
		set  map[string]any
		want string
	}{
		{"no app_id", map[string]any{"app_id": nil}, `"app_id" is required: a positive number`},
		{"app_id word", map[string]any{"app_id": "my-app"}, `"app_id" is required: a positive number`},
		{"no installation", map[string]any{"installation_id": nil}, `"installation_id" is required`},
		{"no key", map[string]any{"private_key": nil}, `"private_key" is required`},
		{"bad PEM", map[string]any{"private_key": strings.Replace(key, "MII", "XXX", 1)}, `"private_key" is not an RSA private key in PEM`},
		{"not PEM", map[string]any{"private_key": "ghp_" + planted}, `"private_key" is not an RSA private key in PEM`},
		{"no repositories", map[string]any{"repositories": nil}, `"repositories" is required and must not be empty`},
		{"empty repositories", map[string]any{"repositories": []any{}}, `"repositories" is required and must not be empty`},
		{"owner/name", map[string]any{"repositories": []any{"acme/docs"}}, `repository "acme/docs" names its owner; give the name alone, "docs"`},
		{"bad name", map[string]any{"repositories": []any{"a b"}}, `repository "a b" is not a repository name`},
		{"bad level", map[string]any{"permissions": map[string]any{"contents": "all"}}, `permission "contents" must be "read", "write" or "admin"`},
		{"bad permission", map[string]any{"permissions": map[string]any{"Contents": "read"}}, `permission "Contents" is not a GitHub permission name`},
		{"permissions list", map[string]any{"permissions": []any{"contents"}}, `"permissions" must be an object`},
		{"http api", map[string]any{"api_url": "http://api.github.com"}, `"api_url" must be an https:// URL`},
		{"unknown key", map[string]any{"token": planted}, `unknown key "token"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("gh", appSecret(key, tt.set))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "gh") {
				t.Fatalf("err = %v, want ErrInvalid with %q", err, tt.want)
			}
			if strings.Contains(err.Error(), planted) || strings.Contains(err.Error(), key[40:80]) {
				t.Errorf("error shows the secret: %q", err)
			}
		})
	}
}

func TestGitHubAppRedacts(t *testing.T) {
	app := githubstub.NewApp(t, "123")
	s, err := Parse("gh", appSecret(app.PEM(), nil))
	if err != nil {
		t.Fatal(err)
	}
	d := fmt.Sprint(app.Key.D)[:20] // the private exponent as %v of the key prints it
	for _, v := range []any{s.GitHubApp, Value{ID: "gh", GitHubApp: s.GitHubApp}} {
		var out []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d"} {
			out = append(out, fmt.Sprintf(verb, v))
		}
		j, _ := json.Marshal(v)
		var buf strings.Builder
		zl := zerolog.New(&buf)
		zl.Info().Interface("v", v).Msg("")
		out = append(out, string(j), buf.String())
		if all := strings.Join(out, "\n"); strings.Contains(all, d) || strings.Contains(all, "PRIVATE") {
			t.Errorf("%T leaks:\n%s", v, all)
		}
	}
}

func TestGitBasic(t *testing.T) {
	h := GitBasic("ghs_abc")
	b, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(h.Value, "Basic "))
	if h.Name != "Authorization" || string(b) != "x-access-token:ghs_abc" {
		t.Errorf("GitBasic = %s %s", h.Name, b)
	}
}
