package githubstub

import (
	"crypto/tls"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Git is a git smart-HTTP server (git http-backend, as CGI) holding private repositories:
// every request needs HTTP Basic x-access-token:<token> with a token the API minted for
// the repository and that has not expired.
type Git struct {
	URL  string // https://<first name>:<port>
	Port int
	api  *API
	root string

	mu    sync.Mutex
	auths []string // the Authorization of every request
}

// StartGit serves owner's repositories under root (bare, made with NewRepo) with a leaf
// for names, allowing what api minted, until the test ends. It skips the test when git
// or its http-backend is missing.
func StartGit(t testing.TB, api *API, leaf tls.Certificate, names ...string) *Git {
	t.Helper()
	backend := httpBackend(t)
	g := &Git{api: api, root: t.TempDir()}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + g.root, "GIT_HTTP_EXPORT_ALL=1"}}
	g.URL, g.Port = serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.allowed(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="GitHub"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}), leaf, names[0])
	return g
}

func httpBackend(t testing.TB) string {
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Skipf("git: %v", err)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("git http-backend: %v", err)
	}
	return p
}

// allowed reports whether r carries x-access-token:<a valid token minted for the
// repository r names>.
func (g *Git) allowed(r *http.Request) bool {
	g.mu.Lock()
	g.auths = append(g.auths, r.Header.Get("Authorization"))
	g.mu.Unlock()
	user, tok, ok := r.BasicAuth()
	if !ok || user != "x-access-token" || !g.api.Valid(tok) {
		return false
	}
	// /<owner>/<repo>.git/...
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
	return len(parts) >= 2 && slices.Contains(g.api.repos(tok), strings.TrimSuffix(parts[1], ".git"))
}

// Auths returns the Authorization of every request, in order.
func (g *Git) Auths() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.auths)
}

// NewRepo makes the bare repository owner/name.git with one commit holding file.
func (g *Git) NewRepo(t testing.TB, owner, name, file, content string) {
	t.Helper()
	work := t.TempDir()
	bare := filepath.Join(g.root, owner, name+".git")
	env := append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(work, file), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	run(work, "init", "-q", "-b", "main")
	run(work, "add", file)
	run(work, "commit", "-q", "-m", "first")
	if err := os.MkdirAll(filepath.Dir(bare), 0o755); err != nil {
		t.Fatal(err)
	}
	run(work, "clone", "-q", "--bare", work, bare)
}
