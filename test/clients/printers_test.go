package clients_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// refusalPrinters are the package managers whose refusal output the README and
// docs/reasons.md describe: each is run against a host off the allowlist, and
// the test states what it prints.
var refusalPrinters = []clientCase{
	// pip names the reason: it prints the HTTP/1.1 status line, whose reason
	// phrase is egressd's ("403 Client Error: Forbidden (egressd: not_allowlisted)").
	{client: "pip", name: "refused https not_allowlisted", tool: "pip", run: func(t *testing.T, w *world, path string) {
		dir := filepath.Join(w.dir, "pip"+strings.ReplaceAll(path, "/", "-"))
		o := w.run(t, nil, python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--retries", "0",
			"--timeout", "10", "-d", dir, "https://"+evilHost+path+"pkg-1.0-py3-none-any.whl")
		printed(t, w, path, o, "403 Client Error: Forbidden (egressd: not_allowlisted)")
	}},
	// npm prints the status line with the reason: "403 Forbidden (egressd:
	// not_allowlisted) - GET https://...". It needs its cafile (npm 11 ignores
	// NODE_EXTRA_CA_CERTS: SELF_SIGNED_CERT_IN_CHAIN without it).
	{client: "npm", name: "refused https not_allowlisted", tool: "npm", run: func(t *testing.T, w *world, path string) {
		env := []string{"npm_config_cache=" + filepath.Join(w.dir, "npm-cache"), "npm_config_cafile=" + w.bundle}
		o := w.run(t, env, "npm", "view", "--registry",
			"https://"+evilHost+path, "--fetch-retries", "0", "left-pad")
		printed(t, w, path, o, "403 Forbidden (egressd: not_allowlisted)")
	}},
	// git prints the status code alone: "The requested URL returned error: 403";
	// with GIT_CURL_VERBOSE=1 its trace shows the Egressd-Reason header.
	{client: "git", name: "refused https not_allowlisted", tool: "git", run: func(t *testing.T, w *world, path string) {
		url := "https://" + evilHost + path + "repo.git"
		o := w.run(t, nil, "git", "ls-remote", url)
		printed(t, w, path, o, "The requested URL returned error: 403")
		if strings.Contains(o.stderr, "not_allowlisted") {
			t.Errorf("git now names the reason: say so in docs/clients.md and docs/reasons.md\n%s", o)
		}
		o = w.run(t, []string{"GIT_CURL_VERBOSE=1"}, "git", "ls-remote", url)
		if !strings.Contains(strings.ToLower(o.stderr), "egressd-reason: not_allowlisted") {
			t.Errorf("GIT_CURL_VERBOSE=1 does not show Egressd-Reason\n%s", o)
		}
	}},
}

// printed fails t unless the client's output holds want; the output is logged,
// since what it prints is the point.
func printed(t *testing.T, w *world, path string, o output, want string) {
	t.Helper()
	t.Logf("printed: %s", o)
	if !strings.Contains(o.stdout+o.stderr, want) {
		t.Errorf("the output lacks %q%s\n%s", want, sinkholeNote(w.mode, o.stdout+o.stderr), o)
	}
	w.assertNotServed(t, path)
}
