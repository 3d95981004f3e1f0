package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/githubstub"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

const (
	ghAPIHost = "api.github.e2e.test"
	ghGitHost = "github.e2e.test"
)

// ghWorld is egressd in front of a stand-in GitHub: the API (which also mints the
// installation tokens) and a git smart-HTTP server holding acme/docs and acme/secret.
type ghWorld struct {
	t     *testing.T
	d     *runner
	api   *githubstub.API
	git   *githubstub.Git
	caPEM string // egressd's CA, as the sandbox trusts it
	key   string // the App's PEM
}

// startGitHubWorld starts the stand-in GitHub (tokens living lifetime) and egressd with a
// github_app credential for [docs]: Bearer on the API host, Basic on the git host.
func startGitHubWorld(t *testing.T, lifetime time.Duration) *ghWorld {
	ca := testpki.New(t)
	app := githubstub.NewApp(t, "4242")
	w := &ghWorld{t: t, key: app.PEM()}
	w.api = githubstub.StartAPI(t, app, "77", ca.Leaf(t, ghAPIHost), ghAPIHost)
	w.api.Lifetime.Store(int64(lifetime))
	w.git = githubstub.StartGit(t, w.api, ca.Leaf(t, ghGitHost), ghGitHost)
	w.git.NewRepo(t, "acme", "docs", "README.md", "private docs\n")
	w.git.NewRepo(t, "acme", "secret", "README.md", "not for this sandbox\n")
	dir := t.TempDir()
	secret, _ := json.Marshal(map[string]any{"gh": map[string]any{"type": "github_app", "app_id": "4242", "installation_id": "77",
		"private_key": w.key, "repositories": []string{"docs"}, "permissions": map[string]string{"contents": "read"}, "api_url": w.api.URL}})
	credFile, caFile := filepath.Join(dir, "credentials.json"), filepath.Join(dir, "roots.pem")
	for name, b := range map[string][]byte{credFile: secret, caFile: ca.PEM()} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dns := dnsstub.Start(t)
	dns.Set(ghAPIHost, "A 127.0.0.1")
	dns.Set(ghGitHost, "A 127.0.0.1")
	entries := fmt.Sprintf("{domain: %s, ports: [%d], credential: gh, github: api}\n{domain: %s, ports: [%d], credential: gh, github: git}",
		ghAPIHost, w.api.Port, ghGitHost, w.git.Port)
	w.d = startFileLoggedRunner(t, mintingConfig("env_github_e2e", entries, dns.Addr, caFile, credFile))
	code, pem := w.d.adminGet("/ca.pem")
	if code != http.StatusOK {
		t.Fatalf("/ca.pem: %d", code)
	}
	w.caPEM = filepath.Join(dir, "egressd-ca.pem")
	if err := os.WriteFile(w.caPEM, []byte(pem), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// sandboxEnv is what a sandbox process runs with: egressd as its proxy, egressd's CA, no
// credential of any kind.
func (w *ghWorld) sandboxEnv() []string {
	proxy := "http://" + w.d.Proxy
	return []string{"PATH=/usr/bin:/bin", "HOME=" + w.t.TempDir(), "HTTPS_PROXY=" + proxy, "https_proxy=" + proxy,
		"REQUESTS_CA_BUNDLE=" + w.caPEM, "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
}

// pyGithub reads acme/<repo> with PyGithub (no token) through egressd and returns its
// output; the stand-in puts the Authorization it received in the description.
func (w *ghWorld) pyGithub(repo string) (string, error) {
	const script = `import sys, github
r = github.Github(base_url=sys.argv[1]).get_repo("acme/" + sys.argv[2])
print(r.full_name, r.private, "|", r.description)`
	cmd := exec.Command("/usr/bin/python3", "-c", script, w.api.URL, repo)
	cmd.Env = w.sandboxEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// python runs a python3 script (sys and requests imported, sys.argv[1] the API URL) as
// the sandbox and returns its output.
func (w *ghWorld) python(script string) string {
	cmd := exec.Command("/usr/bin/python3", "-c", "import sys, requests\n"+script, w.api.URL)
	cmd.Env = w.sandboxEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		w.t.Errorf("python3: %v\n%s", err, out)
	}
	return string(out)
}

// clone runs git clone of acme/<repo> through egressd into a new directory.
func (w *ghWorld) clone(repo string) (string, string, error) {
	dir := filepath.Join(w.t.TempDir(), repo)
	cmd := exec.Command("git", "-c", "http.sslCAInfo="+w.caPEM, "clone", "-q", fmt.Sprintf("%s/acme/%s.git", w.git.URL, repo), dir)
	cmd.Env = w.sandboxEnv()
	out, err := cmd.CombinedOutput()
	return dir, string(out), err
}

// TestRunGitHubApp: egressd mints an installation token scoped to [docs] (the stand-in
// verifies the App JWT) and injects it: PyGithub, holding no token, reads acme/docs and
// the API sees "Bearer <token>"; the echoed token comes back masked; git clones acme/docs
// from a git-http-backend that requires Basic x-access-token:<token>, and cannot clone
// acme/secret; tokens living 4 s are replaced ahead of expiry, never sent expired.
func TestRunGitHubApp(t *testing.T) {
	t.Parallel()
	if err := exec.Command("/usr/bin/python3", "-c", "import github").Run(); err != nil {
		missing := t.Skip
		if os.Getenv("EGRESSD_REQUIRE_CLIENTS") != "" { // make test, after make deps installed it
			missing = t.Fatal
		}
		missing("PyGithub (Debian python3-github) is not installed: make deps")
	}
	w := startGitHubWorld(t, 4*time.Second)
	out, err := w.pyGithub("docs")
	if err != nil || !strings.Contains(out, "acme/docs True | you sent ") || strings.Contains(out, githubstub.TokenPrefix) {
		t.Fatalf("PyGithub: %v\n%s", err, out)
	}
	mints := w.api.Mints()
	if len(mints) == 0 || strings.Join(mints[0].Repositories, ",") != "docs" || mints[0].Permissions["contents"] != "read" {
		t.Fatalf("mints %d, refused %v", len(mints), w.api.Refused())
	}
	dir, out, err := w.clone("docs")
	if b, _ := os.ReadFile(filepath.Join(dir, "README.md")); err != nil || string(b) != "private docs\n" {
		t.Fatalf("git clone acme/docs: %v\n%s", err, out)
	}
	if _, out, err := w.clone("secret"); err == nil {
		t.Errorf("git clone acme/secret succeeded with a token scoped to [docs]\n%s", out)
	}
	if out := w.python(`r = requests.delete(sys.argv[1] + "/installation//token"); print(r.status_code, r.headers.get("Egressd-Reason"))`); out != "403 credential_scope\n" || w.api.Revoked() != 0 {
		t.Errorf("DELETE /installation/token: %q, %d tokens revoked; want 403 credential_scope and none", out, w.api.Revoked())
	}
	first := mints[0].Token
	time.Sleep(5 * time.Second) // past the first token's 4 s
	if out, err := w.pyGithub("docs"); err != nil {
		t.Fatalf("PyGithub after the first token expired: %v\n%s", err, out)
	}
	calls := w.api.Calls()
	for i, c := range calls {
		if !c.Valid || !strings.HasPrefix(c.Auth, "Bearer "+githubstub.TokenPrefix) {
			t.Errorf("API call %d: Authorization valid=%v, a minted Bearer token=%v", i, c.Valid, strings.HasPrefix(c.Auth, "Bearer "))
		}
	}
	if last := calls[len(calls)-1].Auth; last == "Bearer "+first {
		t.Error("the expired first token was sent after its expiry")
	}
	for _, a := range w.git.Auths() {
		if !strings.HasPrefix(a, "Basic ") {
			t.Errorf("git request without Basic x-access-token: %.12q", a)
		}
	}
	if v := w.d.metric(`egressd_credential_mint_total{credential="gh",result="ok"}`); v < 2 {
		t.Errorf("credential_mint_total ok = %v, want at least 2", v)
	}
	if log := string(w.d.LogBytes()); strings.Contains(log, githubstub.TokenPrefix) || strings.Contains(log, w.key[40:80]) {
		t.Error("the log shows a token or the App key")
	}
}

// TestCheckGitHubApp: check refuses a github_app secret with no repositories, a bad key or
// no app_id, and an entry's unknown "github" value, each with the fix; explain names the
// header a github_app entry sets, never a value.
func TestCheckGitHubApp(t *testing.T) {
	key := githubstub.NewApp(t, "1").PEM()
	secret := func(set string) string {
		return `{"type": "github_app", "app_id": "1", "installation_id": "2", "private_key": ` + jsonString(key) +
			`, "repositories": ["docs"]` + set + `}`
	}
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{"good": ` + secret("") + `, "empty": ` + secret(`, "repositories": []`) +
			`, "badkey": ` + strings.Replace(secret(""), "MII", "XXX", 1) + `, "noapp": ` + secret(`, "app_id": ""`) + `}`,
		"environment.json": `{"network": {"allowlist": [{"domain": "api.github.com", "credential": "good"}]}}`,
	})
	cfg, policy := filepath.Join(dir, "egressd.yaml"), filepath.Join(dir, "environment.json")
	res := egressd(t, "check", "--config", cfg)
	for _, want := range []string{
		`empty: credential empty: github_app: "repositories" is required and must not be empty`,
		`badkey: credential badkey: github_app: "private_key" is not an RSA private key in PEM`,
		`noapp: credential noapp: github_app: "app_id" is required: a positive number`,
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("check output lacks %q\n%s", want, res)
		}
	}
	if res.code != 1 || strings.Contains(res.all(), key[40:80]) || strings.Contains(res.stdout, "good:") {
		t.Errorf("check: exit %d (want 1), or it printed the key, or refused the good secret\n%s", res.code, res)
	}
	ex := egressd(t, "explain", "--config", cfg, "https://api.github.com/")
	if f := explainText(t, ex); ex.code != 0 || f["inject"] != "Authorization" || f["credential"] != "good" {
		t.Errorf("explain: %s", ex)
	}
	bad := `{"network": {"allowlist": [{"domain": "github.com", "credential": "good", "github": "ssh"}]}}`
	if err := os.WriteFile(policy, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	res = egressd(t, "check", "--config", cfg)
	if want := `network.allowlist[0].github: unknown value "ssh"; use "api"`; res.code != 1 || !strings.Contains(res.stdout, want) {
		t.Errorf("check: want exit 1 and %q\n%s", want, res)
	}
}
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
