package allowlist

// How an entry sends a github_app credential's installation token: the entry's "github".
const (
	// GitHubAPI sends "Authorization: Bearer <token>", for the REST and GraphQL API hosts.
	GitHubAPI = "api"
	// GitHubGit sends HTTP Basic x-access-token:<token>, for git over HTTPS.
	GitHubGit = "git"
)

// github validates entry i's "github": "" is GitHubAPI; it means nothing without a
// credential.
func (c *compiler) github(i int, e Entry) string {
	switch {
	case e.GitHub != "" && e.Credential == "":
		c.problem(i, "github", `"github" says how a github_app credential's token is sent; add "credential" or remove "github"`)
	case e.GitHub == "" || e.GitHub == GitHubAPI:
		return GitHubAPI
	case e.GitHub != GitHubGit:
		c.problem(i, "github", `unknown value %q; use "api" (Authorization: Bearer, for api.github.com) or "git" (HTTP Basic x-access-token, for git over HTTPS on github.com)`, e.GitHub)
	}
	return e.GitHub
}
