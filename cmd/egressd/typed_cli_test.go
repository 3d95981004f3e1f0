package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestCheckTypedCredentials: check parses every secret of the credentials file as the
// file backend does: a bad typed secret is an error naming the ID, the field and the fix;
// a revoked one a warning; no secret is printed.
func TestCheckTypedCredentials(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{
  "good": {"type": "bearer_token", "token": "` + demoToken + `", "header_name": "X-Api-Key", "prefix": ""},
  "oa": {"type": "oauth2", "client_id": "c", "client_secret": "` + demoToken + `", "token_url": "http://auth.test/t"},
  "gone": {"type": "bearer_token", "token": "` + demoToken + `", "status": "revoked"}
}`,
		"environment.json": `{"network": {"allowlist": [{"domain": "api.example.com", "credential": "good"}]}}`,
	})
	res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
	if res.code != 1 {
		t.Errorf("check: exit %d, want 1\n%s", res.code, res)
	}
	for _, want := range []string{
		`error: oa: credential oa: oauth2: "token_url" must be an https:// URL`,
		`warning: gone: credential gone: status is "revoked"`,
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("check output lacks %q\n%s", want, res)
		}
	}
	if strings.Contains(res.stdout, "good:") {
		t.Errorf("check reports the good secret\n%s", res)
	}
	if strings.Contains(res.all(), demoToken) {
		t.Errorf("check printed the secret:\n%s", res)
	}
}

// policyFileConfig is runConfig with the policy read from the file at path.
func policyFileConfig(path string, port int) string {
	return `version: 1
environment: env_run
listeners:
  - {name: sandbox, address: "127.0.0.1:0", mode: proxy, role: sandbox}
admin: {address: "127.0.0.1:0"}
policy: {file: "` + path + `"}
network:
  unsafe_allow_cidrs: [127.0.0.0/8, "::1/128"]
  default_ports: [80, 443, ` + strconv.Itoa(port) + `]
credentials: {file: credentials.json}
log: {level: info, format: json}
`
}

// TestRunUnrestrictedAndDisabled: a policy without "network" allows every destination
// on network.default_ports (the address guard still applies) and /readyz says "unrestricted": true; "network":
// "disabled" denies every destination with not_allowlisted.
func TestRunUnrestrictedAndDisabled(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	dir := writeFiles(t, map[string]string{
		"open.json":   `{"sources": []}`,
		"closed.json": `{"network": "disabled"}`,
	})
	open := startRunner(t, policyFileConfig(filepath.Join(dir, "open.json"), up.port))
	var ready map[string]any
	open.adminJSON("/readyz", http.StatusOK, &ready)
	if ready["unrestricted"] != true {
		t.Errorf("/readyz = %v, want \"unrestricted\": true", ready)
	}
	res, body := get(t, open.proxyClient(), fmt.Sprintf("http://localhost:%d/hello", up.port))
	if res.StatusCode != http.StatusOK {
		t.Errorf("unrestricted: %d %q, want 200", res.StatusCode, body)
	}
	res, body = get(t, open.proxyClient(), "http://169.254.169.254/latest/meta-data/")
	assertDenied(t, res, body, http.StatusForbidden, "internal_address", "169.254.169.254", 80)

	closed := startRunner(t, policyFileConfig(filepath.Join(dir, "closed.json"), up.port))
	ready = nil
	closed.adminJSON("/readyz", http.StatusOK, &ready)
	if _, ok := ready["unrestricted"]; ok {
		t.Errorf("/readyz of a disabled policy = %v", ready)
	}
	res, body = get(t, closed.proxyClient(), fmt.Sprintf("http://localhost:%d/hello", up.port))
	assertDenied(t, res, body, http.StatusForbidden, "not_allowlisted", "localhost", up.port)
	if n := len(up.requests()); n != 1 {
		t.Errorf("upstream got %d requests, want 1 (the unrestricted one)", n)
	}
}

// TestSandboxEnv: `egressd sandbox env` prints one unquoted NAME=<placeholder> line per
// env variable naming a credential, the same on every run (the key lives in state_dir,
// 0600), and the running egressd's /v1/sandbox/env answers the same placeholders.
func TestSandboxEnv(t *testing.T) {
	t.Parallel()
	dir := writeFiles(t, map[string]string{
		"env.json": `{"network": {"allowlist": [{"domain": "api.openai.com"}]},
  "env": {"OPENAI_API_KEY": {"credential": "openai"}, "PLAIN": {"value": "not ours"}}}`,
	})
	state := filepath.Join(dir, "state")
	cfg := policyFileConfig(filepath.Join(dir, "env.json"), 8443) + "state_dir: " + state + "\n"
	cfgFile := filepath.Join(dir, "egressd.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "credentials.json"), []byte(`{}`), 0o600)
	first := egressd(t, "sandbox", "env", "--config", cfgFile)
	if first.code != 0 || !regexp.MustCompile(`^OPENAI_API_KEY=egressd_ph_openai_[0-9a-f]{32}\n$`).MatchString(first.stdout) {
		t.Fatalf("sandbox env: %s", first)
	}
	if again := egressd(t, "sandbox", "env", "--config", cfgFile); again.stdout != first.stdout {
		t.Errorf("placeholder changed between runs: %q then %q", first.stdout, again.stdout)
	}
	if fi, err := os.Stat(filepath.Join(state, "placeholder.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi, err)
	}
	d := startRunner(t, cfg)
	var env map[string]string
	d.adminJSON("/v1/sandbox/env", http.StatusOK, &env)
	if len(env) != 1 || "OPENAI_API_KEY="+env["OPENAI_API_KEY"]+"\n" != first.stdout {
		t.Errorf("/v1/sandbox/env = %v, want what sandbox env printed (%q)", env, first.stdout)
	}
}

// TestCheckWarnsSplicedReflection: an environment_variable credential placed in
// bodies or queries, beside an entry egressd splices, is a warning naming the
// credential, the entry and tls.intercept: all; with tls.intercept: all, or a
// credential placed in headers only, there is none.
func TestCheckWarnsSplicedReflection(t *testing.T) {
	const policy = `{"network": {"allowlist": [{"domain": "api.example.com"}, {"domain": "*.cdn.test"}]},
  "env": {"BODY_KEY": {"credential": "inbody"}, "HDR_KEY": {"credential": "inheader"}}}`
	secret := func(locs string) string {
		return `{"type": "environment_variable", "value": "` + demoToken + `", "injection_location": ` + locs +
			`, "trusted_domains": ["api.example.com"]}`
	}
	for _, c := range []struct {
		name, tls, bodyLocs string
		warn                bool
	}{
		{"body", "", `["header", "body"]`, true},
		{"query", "", `"query"`, true},
		{"intercept all", "tls: {intercept: all}\n", `["body", "query"]`, false},
		{"headers only", "", `"header"`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeFiles(t, map[string]string{
				"egressd.yaml":     minimalConfig + c.tls + "state_dir: state\n",
				"credentials.json": `{"inbody": ` + secret(c.bodyLocs) + `, "inheader": ` + secret(`"header"`) + `}`,
				"environment.json": policy,
			})
			res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
			warned := regexp.MustCompile(`warning: inbody: environment_variable credential inbody is placed in request ` +
				`bodies or queries: .*\(\*\.cdn\.test\).*set tls\.intercept: all`).MatchString(res.stdout)
			if res.code != 0 || warned != c.warn || strings.Contains(res.stdout, "inheader: environment_variable") {
				t.Errorf("check: exit %d, warned %v, want %v\n%s", res.code, warned, c.warn, res)
			}
			if strings.Contains(res.all(), demoToken) {
				t.Errorf("check printed the secret:\n%s", res)
			}
		})
	}
}
