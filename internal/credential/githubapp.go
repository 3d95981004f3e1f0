package credential

import (
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/golang-jwt/jwt/v5"
	"github.com/rs/zerolog"
)

// TypeGitHubApp is a GitHub App installation: egressd mints installation tokens scoped to
// its repositories (internal/credential/oauth) and injects them.
const TypeGitHubApp = "github_app"

// DefaultGitHubAPI is a github_app secret's api_url when absent.
const DefaultGitHubAPI = "https://api.github.com"

// GitHubGitUser is the user name of HTTP Basic for git over HTTPS with an installation
// token (the token is the password).
const GitHubGitUser = "x-access-token"

// The levels a github_app permission may ask for.
var githubLevels = []string{"read", "write", "admin"}

// GitHub's rules for the names: a repository name is up to 100 characters of letters,
// digits, '.', '-' and '_' (never "." or ".."); a permission is a snake_case word.
var (
	githubRepoName   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
	githubPermission = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

// GitHubApp is a GitHub App installation. PrivateKey is secret: GitHubApp redacts itself
// in every rendering, like Header.
type GitHubApp struct {
	AppID          string
	InstallationID string
	PrivateKey     *rsa.PrivateKey
	Repositories   []string          // names without the owner; never empty
	Permissions    map[string]string // permission -> "read", "write" or "admin"; empty: the installation's
	APIURL         string            // https, no trailing slash
}

// TokenURL is where installation tokens are minted.
func (g *GitHubApp) TokenURL() string {
	return g.APIURL + "/app/installations/" + g.InstallationID + "/access_tokens"
}

// String shows the App, installation and repositories, never the key.
func (g *GitHubApp) String() string {
	return "github_app " + g.AppID + " installation " + g.InstallationID + " at " + g.APIURL +
		" for [" + strings.Join(g.Repositories, " ") + "]"
}

// GoString is String for %#v.
func (g *GitHubApp) GoString() string { return "&credential.GitHubApp{" + g.String() + "}" }

// Format implements fmt.Formatter so that no verb reaches the key.
func (g *GitHubApp) Format(f fmt.State, verb rune) { format(f, verb, g.String(), g.GoString()) }

// MarshalJSON writes everything but the key.
func (g *GitHubApp) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		AppID          string            `json:"app_id"`
		InstallationID string            `json:"installation_id"`
		Repositories   []string          `json:"repositories"`
		Permissions    map[string]string `json:"permissions"`
		APIURL         string            `json:"api_url"`
	}{g.AppID, g.InstallationID, g.Repositories, g.Permissions, g.APIURL})
}

// MarshalZerologObject writes the App, installation and token URL.
func (g *GitHubApp) MarshalZerologObject(e *zerolog.Event) {
	e.Str("app_id", g.AppID).Str("installation_id", g.InstallationID).Str("api_url", g.APIURL)
}

// GitBasic returns the header that carries an installation token to a git host: HTTP
// Basic x-access-token:<token>, what GitHub's git over HTTPS accepts. token is secret.
func GitBasic(token string) Header {
	return Header{Name: "Authorization", Value: "Basic " + base64.StdEncoding.EncodeToString([]byte(GitHubGitUser+":"+token))}
}

func parseGitHubApp(id string, raw map[string]any) (Secret, error) {
	const typ = TypeGitHubApp
	fields := []string{"app_id", "private_key", "installation_id", "repositories", "permissions", "api_url"}
	if err := typedFields(id, typ, raw, fields, []string{"private_key"}); err != nil {
		return Secret{}, err
	}
	g := &GitHubApp{}
	var err error
	if g.AppID, err = githubNumber(id, raw, "app_id", `the App's ID from its settings page, e.g. "123456"`); err != nil {
		return Secret{}, err
	}
	if g.InstallationID, err = githubNumber(id, raw, "installation_id", `from the installation's URL (.../installations/<id>), e.g. "7890123"`); err != nil {
		return Secret{}, err
	}
	if g.PrivateKey, err = jwt.ParseRSAPrivateKeyFromPEM([]byte(raw["private_key"].(string))); err != nil {
		return Secret{}, valueErr(id, typ+`: "private_key" is not an RSA private key in PEM ("-----BEGIN RSA PRIVATE KEY-----", as GitHub issues it, or PKCS#8); store the .pem file GitHub gave, line breaks included`)
	}
	if g.Repositories, err = githubRepos(id, raw); err != nil {
		return Secret{}, err
	}
	if g.Permissions, err = githubPermissions(id, raw); err != nil {
		return Secret{}, err
	}
	if g.APIURL, err = githubAPIURL(id, raw); err != nil {
		return Secret{}, err
	}
	return Secret{Type: typ, GitHubApp: g}, nil
}

// githubNumber reads raw[k], a positive decimal number given as a string or a JSON number.
func githubNumber(id string, raw map[string]any, k, where string) (string, error) {
	var s string
	switch v := raw[k].(type) {
	case string:
		s = v
	case float64:
		s = strconv.FormatFloat(v, 'f', -1, 64)
	case json.Number:
		s = v.String()
	}
	if n, err := strconv.ParseUint(s, 10, 63); err != nil || n == 0 {
		return "", valueErr(id, TypeGitHubApp+": "+quoteName(k)+" is required: a positive number, "+where)
	}
	return s, nil
}

// githubRepos reads the repositories: at least one, each a bare name. An empty list would
// mint a token for every repository of the installation.
func githubRepos(id string, raw map[string]any) ([]string, error) {
	const typ = TypeGitHubApp
	repos, err := stringList(id, typ, raw, "repositories")
	if err != nil {
		return nil, err
	}
	if len(repos) == 0 {
		return nil, valueErr(id, typ+`: "repositories" is required and must not be empty (an empty list would mint a token for every repository of the installation); list the repository names the sandbox may use, e.g. ["docs", "api-server"]`)
	}
	for _, r := range repos {
		if owner, name, ok := strings.Cut(r, "/"); ok && githubRepoName.MatchString(name) {
			return nil, valueErr(id, typ+`: repository `+quoteName(r)+` names its owner; give the name alone, `+quoteName(name)+` (the installation's account owns it; owner `+quoteName(owner)+`)`)
		}
		if !githubRepoName.MatchString(r) || r == "." || r == ".." {
			return nil, valueErr(id, typ+`: repository `+quoteName(r)+` is not a repository name (letters, digits, ".", "-" and "_", at most 100)`)
		}
	}
	slices.Sort(repos)
	return slices.Compact(repos), nil
}

// githubPermissions reads the permissions object; absent means the installation's own.
func githubPermissions(id string, raw map[string]any) (map[string]string, error) {
	const typ = TypeGitHubApp
	v, ok := raw["permissions"]
	if !ok {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, valueErr(id, typ+`: "permissions" must be an object of permission to level, e.g. {"contents": "read", "pull_requests": "write"}`)
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		level, _ := m[k].(string)
		if !githubPermission.MatchString(k) {
			return nil, valueErr(id, typ+`: permission `+quoteName(k)+` is not a GitHub permission name (snake_case, e.g. "contents", "pull_requests")`)
		}
		if !slices.Contains(githubLevels, level) {
			return nil, valueErr(id, typ+`: permission `+quoteName(k)+` must be "read", "write" or "admin"`)
		}
		out[k] = level
	}
	return out, nil
}

// githubAPIURL reads api_url: an https URL without user info, query or fragment.
func githubAPIURL(id string, raw map[string]any) (string, error) {
	s, err := optString(id, TypeGitHubApp, raw, "api_url", DefaultGitHubAPI)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", valueErr(id, TypeGitHubApp+`: "api_url" must be an https:// URL without user info or query: "https://api.github.com", or "https://<host>/api/v3" for GitHub Enterprise Server`)
	}
	return strings.TrimRight(s, "/"), nil
}
