package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/oauth2"

	"github.com/egressd/egressd/internal/credential"
)

// The App JWT GitHub accepts: RS256, issued by the App ID, at most ten minutes long.
const (
	// jwtBackdate puts iat in the past, so that a GitHub clock behind egressd's still
	// finds the JWT issued.
	jwtBackdate = 60 * time.Second
	// jwtLife is exp - iat: GitHub's maximum.
	jwtLife = 10 * time.Minute
	// githubAPIVersion is the REST API version egressd's calls are written against.
	githubAPIVersion = "2022-11-28"
	// maxGitHubAnswer bounds the token response read.
	maxGitHubAnswer = 64 << 10
)

// minted reports whether v's headers come from a token egressd mints.
func minted(v credential.Value) bool { return v.OAuth2 != nil || v.GitHubApp != nil }

// mint makes one attempt for st's credential type.
func (m *Manager) mint(ctx context.Context, st *state) (*oauth2.Token, error) {
	if st.app != nil {
		tok, err := m.mintApp(ctx, st.app)
		if m.o.Mint != nil {
			m.o.Mint(st.id, result(err))
		}
		return tok, err
	}
	return m.exchange(ctx, st)
}

// adoptApp takes the installation app. A token minted for another scope (repositories,
// permissions, installation, API), or for an oauth2 client the secret was before, is
// dropped at once: a security team that narrows a credential must not see the wider token
// served until it expires.
func (st *state) adoptApp(app *credential.GitHubApp) {
	if st.secret != nil || st.app != nil && !sameScope(st.app, app) {
		st.cur.Store(nil)
	}
	st.app, st.secret, st.refresh = app, nil, ""
}

// sameScope reports whether tokens minted for a serve b unchanged.
func sameScope(a, b *credential.GitHubApp) bool {
	return a.AppID == b.AppID && a.InstallationID == b.InstallationID && a.APIURL == b.APIURL &&
		slices.Equal(a.Repositories, b.Repositories) && maps.Equal(a.Permissions, b.Permissions)
}

// tokenURL is where st's tokens come from, for log lines.
func (st *state) tokenURL() string {
	if st.app != nil {
		return st.app.TokenURL()
	}
	return st.secret.TokenURL
}

// kind names st's credential type in log lines.
func (st *state) kind() string {
	if st.app != nil {
		return credential.TypeGitHubApp
	}
	return credential.TypeOAuth2
}

// tokenRequest is the body of POST /app/installations/{id}/access_tokens.
type tokenRequest struct {
	Repositories []string          `json:"repositories"`
	Permissions  map[string]string `json:"permissions,omitempty"`
}

// tokenAnswer is the part of GitHub's answer egressd reads.
type tokenAnswer struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// mintApp makes one token call: the App JWT for an installation token scoped to app's
// repositories and permissions, through the client SetClient gave.
func (m *Manager) mintApp(ctx context.Context, app *credential.GitHubApp) (*oauth2.Token, error) {
	c := m.tokenClient()
	if c == nil {
		return nil, errNoClient
	}
	req, err := appRequest(ctx, app)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGitHubAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusCreated {
		// GitHub's message may quote what it was sent: the status says enough.
		return nil, fmt.Errorf("the token endpoint answered %s", resp.Status)
	}
	var a tokenAnswer
	if err := json.Unmarshal(body, &a); err != nil || a.ExpiresAt.IsZero() {
		return nil, errBadToken
	}
	tok := &oauth2.Token{AccessToken: a.Token, Expiry: a.ExpiresAt}
	return tok, checkToken(tok)
}

// appRequest builds the token call, signed with a fresh App JWT. The JWT uses the real
// clock: GitHub checks it against its own.
func appRequest(ctx context.Context, app *credential.GitHubApp) (*http.Request, error) {
	iat := time.Now().Add(-jwtBackdate)
	claims := jwt.RegisteredClaims{Issuer: app.AppID, IssuedAt: jwt.NewNumericDate(iat), ExpiresAt: jwt.NewNumericDate(iat.Add(jwtLife))}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(app.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("signing the App JWT: %w", err)
	}
	body, err := json.Marshal(tokenRequest{Repositories: app.Repositories, Permissions: app.Permissions})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, app.TokenURL(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+signed)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Api-Version", githubAPIVersion)
	req.Header.Set("User-Agent", "egressd")
	return req, nil
}
