package inject

import (
	"path"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// DetailGitHubRevoke is the credential_scope detail of a request that would revoke the
// installation token egressd injects.
const DetailGitHubRevoke = "github_token_revoke"

// RevokesGitHubToken reports whether a request to urlPath, carrying a github_app
// installation token, could be GitHub's "revoke an installation access token"
// (DELETE /installation/token, under /api/v3 on GitHub Enterprise Server). The token is
// shared by every request of the credential until it expires: a sandbox that revoked it
// would break them all. Every method is refused there (no other endpoint lives at that
// path), the path compared cleaned, in any case, with backslashes as slashes, and by
// prefix: a suffix a server might ignore (".json", ";x", a trailing dot or space) is no
// other endpoint either.
func RevokesGitHubToken(urlPath string) bool {
	p := strings.ToLower(path.Clean("/" + strings.ReplaceAll(urlPath, `\`, "/")))
	p = strings.TrimPrefix(p, "/api/v3")
	return strings.HasPrefix(p, "/installation/token")
}

// githubHeaders returns what v sets on r's requests: for a github_app credential on a
// "github": "git" entry, the installation token as HTTP Basic x-access-token:<token>
// (git over HTTPS takes no Bearer token); otherwise v's headers.
func githubHeaders(r *allowlist.Rule, v credential.Value) []credential.Header {
	if v.GitHubApp == nil || r.GitHub != allowlist.GitHubGit {
		return v.Headers
	}
	tok, ok := v.Token()
	if !ok {
		return v.Headers
	}
	return []credential.Header{credential.GitBasic(tok)}
}
