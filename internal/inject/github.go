package inject

import (
	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

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
