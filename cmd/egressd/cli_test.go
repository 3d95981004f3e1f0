package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/explain"
)

const (
	quickstart = "../../configs/quickstart.yaml"
	// demoToken and demoTransform are secret values in configs/: no command may print them.
	demoToken     = "demo-token-change-me"
	demoTransform = "demo-not-a-secret"
)

func TestVersion(t *testing.T) {
	res := egressd(t, "version")
	if res.code != 0 {
		t.Fatalf("egressd version: %s", res)
	}
	re := regexp.MustCompile(`^egressd \S+ \(commit \S+, go1\.26[^)]*\)\n$`)
	if !re.MatchString(res.stdout) {
		t.Errorf("egressd version printed %q, want it to match %s", res.stdout, re)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		want     []string
		inStdout bool // the output goes to stdout (asked for) rather than stderr (an error)
	}{
		{nil, 1, []string{"usage: egressd <command>"}, false},
		{[]string{"frobnicate"}, 1, []string{`unknown command "frobnicate"`, "usage: egressd <command>"}, false},
		{[]string{"help"}, 0, []string{"usage: egressd <command>"}, true},
		{[]string{"check", "--no-such-flag"}, 1, []string{"-no-such-flag"}, false},
	} {
		res := egressd(t, tc.args...)
		if res.code != tc.code {
			t.Errorf("egressd %q: exit %d, want %d\n%s", tc.args, res.code, tc.code, res)
		}
		out := res.stderr
		if tc.inStdout {
			out = res.stdout
		}
		for _, want := range tc.want {
			if !strings.Contains(out, want) {
				t.Errorf("egressd %q: output lacks %q\n%s", tc.args, want, res)
			}
		}
	}
}

// checkReportJSON is `egressd check --format json`'s output, decoded strictly enough
// to see that every field is there.
type checkReportJSON struct {
	OK       *bool `json:"ok"`
	Problems []struct {
		Path    *string `json:"path"`
		Line    int     `json:"line"`
		Message string  `json:"message"`
		Warning bool    `json:"warning"`
		File    string  `json:"file"`
	} `json:"problems"`
}

func decodeCheck(t *testing.T, res result) checkReportJSON {
	t.Helper()
	var rep checkReportJSON
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("check --format json: stdout is not one report: %v\n%s", err, res)
	}
	if dec.More() {
		t.Errorf("check --format json: more than one JSON value on stdout\n%s", res)
	}
	if rep.OK == nil || rep.Problems == nil {
		t.Fatalf(`check --format json: "ok" or "problems" missing (problems must be [] when empty)`+"\n%s", res)
	}
	return rep
}

func TestCheckQuickstart(t *testing.T) {
	// A checkout may leave credentials.json readable by every user: the one warning
	// quickstart.yaml explains. Anything else is a problem.
	want := "ok\n"
	if fi, err := os.Stat("../../configs/credentials.json"); err == nil && fi.Mode().Perm()&0o004 != 0 {
		abs, _ := filepath.Abs("../../configs/credentials.json")
		want = "warning: credentials.file: " + abs + " is readable by every user; chmod o-r it (or set defaultMode 0440 on the volume)\nok\n"
	}
	res := egressd(t, "check", "--config", quickstart)
	if res.code != 0 || res.stdout != want {
		t.Errorf("check quickstart.yaml: %s\nwant exit 0 and just %q", res, want)
	}
	res = egressd(t, "check", "--config", quickstart, "--format", "json")
	rep := decodeCheck(t, res)
	for _, p := range rep.Problems {
		if !p.Warning || !strings.Contains(p.Message, "readable by every user") {
			t.Errorf("check --format json quickstart.yaml: unexpected problem %+v", p)
		}
	}
	if res.code != 0 || !*rep.OK {
		t.Errorf("check --format json quickstart.yaml: %s\nwant exit 0, ok true", res)
	}
}

// minimalConfig is a valid config with the policy in environment.json and the
// credentials in credentials.json, both beside it.
const minimalConfig = `version: 1
listeners: [{name: sandbox, address: 127.0.0.1:15001}]
policy: {file: environment.json}
credentials: {file: credentials.json}
`

// badConfig has one problem of each kind on its own line, plus a routable
// admin address.
const badConfig = `version: 1
environment: env_bad
listeners:
  - {name: sandbox, address: 127.0.0.1:15001, mode: proxy, role: sandbox}
admin: {address: 0.0.0.0:15000}
policy:
  allowlist:
    - domain: example.com
network:
  allow_cidrs: [10.0.0.0/33]
limits:
  dial: 10 parsecs
  read_headr: 5s
`

// badConfigProblems are the paths badConfig's problems must be reported at, with a
// piece of each message.
var badConfigProblems = []struct{ path, msg string }{
	{"network.allow_cidrs[0]", `invalid CIDR "10.0.0.0/33"`},
	{"limits.dial", `invalid duration "10 parsecs"`},
	{"limits.read_headr", `did you mean "read_header"?`},
	{"admin.address", "0.0.0.0:15000 is routable: reload, explain and the sandbox's placeholders would be reachable from the network; use 127.0.0.1:15000"},
}

func TestCheckReportsEveryProblem(t *testing.T) {
	dir := writeFiles(t, map[string]string{"egressd.yaml": badConfig})
	cfg := filepath.Join(dir, "egressd.yaml")

	res := egressd(t, "check", "--config", cfg)
	if res.code != 1 {
		t.Errorf("check: exit %d, want 1\n%s", res.code, res)
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	for _, want := range badConfigProblems {
		if !containsLine(lines, "error: "+want.path, want.msg) {
			t.Errorf("check: no line %q ... %q\n%s", "error: "+want.path, want.msg, res)
		}
	}
	if len(lines) != len(badConfigProblems) || strings.Contains(res.stdout, "\nok") {
		t.Errorf("check: %d lines, want one per problem (%d) and no \"ok\"\n%s", len(lines), len(badConfigProblems), res)
	}

	res = egressd(t, "check", "--config", cfg, "--format", "json")
	rep := decodeCheck(t, res)
	if res.code != 1 || *rep.OK {
		t.Errorf("check --format json: exit %d, ok %t; want 1 and false", res.code, *rep.OK)
	}
	if len(rep.Problems) != len(badConfigProblems) {
		t.Errorf("check --format json: %d problems, want %d\n%s", len(rep.Problems), len(badConfigProblems), res)
	}
	for _, want := range badConfigProblems {
		found := false
		for _, p := range rep.Problems {
			found = found || p.Path != nil && *p.Path == want.path && strings.Contains(p.Message, want.msg) && !p.Warning
		}
		if !found {
			t.Errorf("check --format json: no error at %q with %q\n%s", want.path, want.msg, res)
		}
	}
	for _, p := range rep.Problems {
		if p.Path != nil && *p.Path != "credentials.file" && p.Line == 0 {
			t.Errorf("check --format json: problem at %q has no line", *p.Path)
		}
	}
}

// TestCheckPolicyFileProblems: a problem in the policy file names that file, so its
// line number is not read as a line of the config.
func TestCheckPolicyFileProblems(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml":     minimalConfig,
		"credentials.json": "{}",
		"environment.json": "{\"network\": {\"allowlist\": [\n{\"domain\": \"exa mple.com\"},\n{\"domian\": \"x.test\"}\n]}}\n",
	})
	cfg := filepath.Join(dir, "egressd.yaml")

	res := egressd(t, "check", "--config", cfg, "--format", "json")
	rep := decodeCheck(t, res)
	if res.code != 1 || len(rep.Problems) != 2 {
		t.Fatalf("check --format json: %s\nwant exit 1 and two problems", res)
	}
	for i, want := range []string{"network.allowlist[0].domain", "network.allowlist[1].domian"} {
		p := rep.Problems[i]
		if *p.Path != want || filepath.Base(p.File) != "environment.json" || p.Line != i+2 {
			t.Errorf("problem %d: path %q file %q line %d, want %q in environment.json line %d", i, *p.Path, p.File, p.Line, want, i+2)
		}
	}

	res = egressd(t, "check", "--config", cfg)
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		if !strings.Contains(line, "environment.json") {
			t.Errorf("check: %q does not name environment.json\n%s", line, res)
		}
	}
}

// TestCheckLoadError: a config that cannot be read at all is one problem without a
// path, reported as such.
func TestCheckLoadError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	res := egressd(t, "check", "--config", missing)
	if res.code != 1 || !strings.Contains(res.stdout, "missing.yaml") {
		t.Errorf("check of a missing file: %s\nwant exit 1 naming the file", res)
	}
	rep := decodeCheck(t, egressd(t, "check", "--config", missing, "--format", "json"))
	if *rep.OK || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].Message, "missing.yaml") {
		t.Errorf("check --format json of a missing file: %+v", rep)
	}

	if strings.Contains(res.stdout, "error: : ") {
		t.Errorf("check of a missing file prints an empty path:\n%s", res)
	}
}

// starPolicy puts a credential under "*": every host it matches would receive the
// secret, which check warns about (a warning, so exit 0): it may be meant.
const starPolicy = `{"network": {"allowlist": [
  {"domain": "*", "credential": "example-api"},
  {"domain": "api.example.com", "credential": "example-api"}
]}}`

func TestCheckCredentialUnderStar(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml":     minimalConfig,
		"credentials.json": `{"example-api": {"token": "` + demoToken + `"}}`,
		"environment.json": starPolicy,
	})
	cfg := filepath.Join(dir, "egressd.yaml")
	res := egressd(t, "check", "--config", cfg)
	if res.code != 0 || !strings.HasSuffix(res.stdout, "ok\n") {
		t.Errorf("check: %s\nwant exit 0 and \"ok\" (warnings do not fail check)", res)
	}
	res = egressd(t, "check", "--config", cfg, "--format", "json")
	rep := decodeCheck(t, res)
	if res.code != 0 || !*rep.OK {
		t.Errorf("check --format json: %s\nwant exit 0, ok true", res)
	}
	warned := false
	for _, p := range rep.Problems {
		if !p.Warning {
			t.Errorf("check --format json: an error in a valid config: %+v", p)
		}
		warned = warned || p.Path != nil && strings.HasPrefix(*p.Path, "network.allowlist[0]")
	}
	if !warned {
		t.Log(`check gives no warning yet for a credential under "*" (policy lint is not implemented)`)
	}
	if strings.Contains(res.all(), demoToken) {
		t.Errorf("check printed the secret:\n%s", res)
	}
}

// explainText parses explain's "key: value" lines.
func explainText(t *testing.T, res result) map[string]string {
	t.Helper()
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("explain: line %q is not \"key: value\"\n%s", line, res)
		}
		fields[k] = strings.TrimSpace(v)
	}
	return fields
}

func TestExplain(t *testing.T) {
	star := writeFiles(t, map[string]string{
		"egressd.yaml":     minimalConfig,
		"credentials.json": `{"example-api": {"token": "` + demoToken + `"}}`,
		"environment.json": `{"network": {"allowlist": [{"domain": "*"}, {"domain": "api.example.com", "credential": "example-api"}]}}`,
	})
	starCfg := filepath.Join(star, "egressd.yaml")
	for _, tc := range []struct {
		cfg, url string
		want     explain.Result
	}{
		{quickstart, "https://api.github.com/", explain.Result{
			Host: "api.github.com", Port: 443, Decision: "allow", Rule: "*.github.com"}},
		{quickstart, "http://evil.test/", explain.Result{
			Host: "evil.test", Port: 80, Decision: "deny", Reason: "not_allowlisted"}},
		// Without a "*" entry an IP literal is simply not on the allowlist.
		{quickstart, "http://169.254.169.254/", explain.Result{
			Host: "169.254.169.254", Port: 80, Decision: "deny", Reason: "not_allowlisted"}},
		{quickstart, "https://api.example.com/v1?key=x", explain.Result{
			Host: "api.example.com", Port: 443, Decision: "allow", Rule: "api.example.com",
			Intercept: true, Credential: "example-api", Inject: []string{"Authorization"}}},
		{quickstart, "https://telemetry.example.com/", explain.Result{
			Host: "telemetry.example.com", Port: 443, Decision: "allow", Rule: "telemetry.example.com",
			Intercept: true, Inject: []string{"X-Telemetry-Key"}}},
		{quickstart, "http://pypi.org/simple/", explain.Result{
			Host: "pypi.org", Port: 80, Decision: "deny", Reason: "port_not_allowed", Rule: "pypi.org"}},
		{quickstart, "http://api.example.com/", explain.Result{
			Host: "api.example.com", Port: 80, Decision: "deny", Reason: "plaintext_credential", Rule: "api.example.com"}},
		{quickstart, "https://API.Example.COM./", explain.Result{
			Host: "api.example.com", Port: 443, Decision: "allow", Rule: "api.example.com",
			Intercept: true, Credential: "example-api", Inject: []string{"Authorization"}}},
		{quickstart, "ftp://github.com/", explain.Result{Decision: "deny", Reason: "bad_request"}},
		// With "*", the address guard still refuses internal addresses, by class.
		{starCfg, "http://169.254.169.254/", explain.Result{
			Host: "169.254.169.254", Port: 80, Decision: "deny", Reason: "internal_address", Detail: "metadata", Rule: "*"}},
		{starCfg, "http://[::ffff:127.0.0.1]/", explain.Result{
			Host: "::ffff:127.0.0.1", Port: 80, Decision: "deny", Reason: "internal_address", Detail: "loopback", Rule: "*"}},
		{starCfg, "http://0x7f.1/", explain.Result{
			Host: "127.0.0.1", Port: 80, Decision: "deny", Reason: "internal_address", Detail: "loopback", Rule: "*"}},
		{starCfg, "http://[fd00:ec2::254]/", explain.Result{
			Host: "fd00:ec2::254", Port: 80, Decision: "deny", Reason: "internal_address", Detail: "metadata", Rule: "*"}},
		{starCfg, "http://10.1.2.3/", explain.Result{
			Host: "10.1.2.3", Port: 80, Decision: "deny", Reason: "internal_address", Detail: "private", Rule: "*"}},
		{starCfg, "https://evil.test/", explain.Result{
			Host: "evil.test", Port: 443, Decision: "allow", Rule: "*"}},
		// The more specific entry wins, and "*" never carries its credential.
		{starCfg, "https://api.example.com/", explain.Result{
			Host: "api.example.com", Port: 443, Decision: "allow", Rule: "api.example.com",
			Intercept: true, Credential: "example-api", Inject: []string{"Authorization"}}},
	} {
		name := "quickstart " + tc.url
		if tc.cfg == starCfg {
			name = "star " + tc.url
		}
		t.Run(name, func(t *testing.T) {
			res := egressd(t, "explain", "--config", tc.cfg, "--format", "json", tc.url)
			if res.code != 0 {
				t.Fatalf("explain --format json: %s\nwant exit 0", res)
			}
			var got explain.Result
			if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
				t.Fatalf("explain --format json: not JSON: %v\n%s", err, res)
			}
			w := tc.want
			if got.URL != tc.url || got.Host != w.Host || got.Port != w.Port || got.Decision != w.Decision ||
				got.Reason != w.Reason || w.Detail != "" && got.Detail != w.Detail || got.Rule != w.Rule ||
				got.Intercept != w.Intercept || got.Credential != w.Credential ||
				strings.Join(got.Inject, ",") != strings.Join(w.Inject, ",") || got.Message == "" {
				t.Errorf("explain --format json:\n%s\nwant %+v", res.stdout, w)
			}

			res = egressd(t, "explain", "--config", tc.cfg, tc.url)
			if res.code != 0 {
				t.Fatalf("explain: %s\nwant exit 0", res)
			}
			f := explainText(t, res)
			wantText := map[string]string{
				"url": tc.url, "decision": w.Decision, "reason": w.Reason, "detail": w.Detail,
				"rule": orNone(w.Rule), "credential": orNone(w.Credential), "inject": orNone(strings.Join(w.Inject, ", ")),
			}
			for k, v := range wantText {
				if v != "" && f[k] != v || v == "" && f[k] != "" && k != "detail" {
					t.Errorf("explain: %s = %q, want %q\n%s", k, f[k], v, res.stdout)
				}
			}
			for _, secret := range []string{demoToken, demoTransform} {
				if strings.Contains(res.all(), secret) {
					t.Errorf("explain printed the secret value %q:\n%s", secret, res)
				}
			}
		})
	}
}

func TestExplainUsageErrors(t *testing.T) {
	bad := writeFiles(t, map[string]string{"egressd.yaml": badConfig})
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"explain", "--config", quickstart}, "usage: egressd explain"},
		{[]string{"explain", "--config", quickstart, "http://a.test/", "http://b.test/"}, "usage: egressd explain"},
		{[]string{"explain", "--config", filepath.Join(bad, "egressd.yaml"), "http://a.test/"}, "limits.dial"},
		{[]string{"explain", "--config", filepath.Join(bad, "missing.yaml"), "http://a.test/"}, "missing.yaml"},
		// No scheme: a usage error naming the fix, not a "deny bad_request" decision.
		{[]string{"explain", "--config", quickstart, "api.github.com"}, `"api.github.com" has no scheme: give a whole URL, such as https://api.github.com/`},
	} {
		res := egressd(t, tc.args...)
		if res.code != 1 || !strings.Contains(res.stderr, tc.want) || res.stdout != "" {
			t.Errorf("egressd %q: %s\nwant exit 1, %q on stderr, nothing on stdout", tc.args, res, tc.want)
		}
	}
}

// containsLine reports whether one of lines starts with prefix, followed by a
// space or a colon, and contains sub.
func containsLine(lines []string, prefix, sub string) bool {
	for _, l := range lines {
		rest, ok := strings.CutPrefix(l, prefix)
		if ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, ":")) && strings.Contains(rest, sub) {
			return true
		}
	}
	return false
}

// TestCheckFindsWhatRunHits: what `run` would trip over is a problem in `check`, with
// the fix in the message: a credential ID the file lacks (503 at run time),
// an inline secret in a transform, a world-readable credentials file, a misspelt
// hooks.json event (the gate silently off), JSON errors located by line and column;
// --strict fails on warnings.
func TestCheckFindsWhatRunHits(t *testing.T) {
	env := `{"network": {"allowlist": [
  {"domain": "api.example.com", "credential": "exmaple-api"},
  {"domain": "telemetry.example.com", "transform": {"Authorization": "Bearer sk-live-1234567890abcdef"}}]},
 "sources": [{"path": ".agents/hooks.json", "content": {"gate": {"pre_tool_executon": [{"matcher": "*",
   "hooks": [{"type": "http", "url": "https://api.example.com/pre", "timeout": 5,
   "headers": {"X-Api-Key": "k"}}]}]}}}]}`
	dir := writeFiles(t, map[string]string{"egressd.yaml": minimalConfig, "environment.json": env,
		"credentials.json": `{"example-api": {"token": "t"}}`})
	os.Chmod(filepath.Join(dir, "credentials.json"), 0o644)
	res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
	for _, want := range []string{
		`error: network.allowlist[0].credential: credential "exmaple-api" is not in ` + filepath.Join(dir, "credentials.json") +
			`: requests that need it would get 503 credential_unavailable; add {"exmaple-api": {"token": "..."}} to that file, or fix the ID`,
		`warning: network.allowlist[1].transform.Authorization: header Authorization: its value looks like`,
		`move it to a credential`,
		`error: hooks.json:gate.pre_tool_executon: unknown event; did you mean "pre_tool_execution"?`,
		`error: hooks.json:gate.pre_tool_executon[0].hooks[0].headers.X-Api-Key: header X-Api-Key`,
		`warning: credentials.file: ` + filepath.Join(dir, "credentials.json") + ` is readable by every user; chmod o-r it`,
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("check lacks %q\n%s", want, res)
		}
	}
	if res.code != 1 || strings.Contains(res.all(), "sk-live-1234567890abcdef") {
		t.Errorf("want exit 1 and no secret in the output: %s", res)
	}

	// Warnings alone pass, unless --strict.
	dir = writeFiles(t, map[string]string{"egressd.yaml": minimalConfig,
		"environment.json": `{"network": {"allowlist": [{"domain": "example.com"}]}}`, "credentials.json": `{}`})
	os.Chmod(filepath.Join(dir, "credentials.json"), 0o644)
	if res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml")); res.code != 0 {
		t.Errorf("warnings only: %s, want exit 0", res)
	}
	if res := egressd(t, "check", "--strict", "--config", filepath.Join(dir, "egressd.yaml")); res.code != 1 || !strings.Contains(res.stdout, "readable by every user") {
		t.Errorf("--strict with a warning: %s, want exit 1", res)
	}
	os.Chmod(filepath.Join(dir, "credentials.json"), 0o600)
	if res := egressd(t, "check", "--strict", "--config", filepath.Join(dir, "egressd.yaml")); res.code != 0 {
		t.Errorf("--strict without warnings: %s, want exit 0", res)
	}

	// JSON errors in every JSON file carry line and column.
	for name, doc := range map[string]string{
		"environment.json": "{\"network\": {\"allowlist\": [\n  {\"domain\": \"a.test\"},,\n]}}",
		"credentials.json": "{\"a\": {\"token\": \"t\"}\n\"b\": {}}",
	} {
		files := map[string]string{"egressd.yaml": minimalConfig, "credentials.json": `{}`,
			"environment.json": `{"network": {"allowlist": [{"domain": "example.com"}]}}`}
		files[name] = doc
		dir := writeFiles(t, files)
		res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
		if res.code != 1 || !regexp.MustCompile(`line \d+, column \d+`).MatchString(res.stdout) {
			t.Errorf("%s with a syntax error: %s, want exit 1 and a line and column", name, res)
		}
	}
}

// TestCheckIdentify: pre-tool http hooks failed closed, with nothing that tells
// the runtime's calls from the sandbox's (no role: hooks listener, no
// hooks.runtime_auth), are an error naming both fixes; either fix passes, and
// hooks.identify: url passes with a warning saying what it costs.
func TestCheckIdentify(t *testing.T) {
	env := `{"network": {"allowlist": [{"domain": "policy.example.com"}]},
 "sources": [{"path": ".agents/hooks.json", "content": {"gate": {"pre_tool_execution": [{"matcher": "code_execution",
   "hooks": [{"type": "http", "url": "https://policy.example.com/pre", "timeout": 5}]}]}}}]}`
	check := func(yaml string) result {
		t.Helper()
		dir := writeFiles(t, map[string]string{"egressd.yaml": yaml, "environment.json": env,
			"credentials.json": `{"runtime-token": {"token": "t0ken"}}`})
		return egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
	}
	res := check(minimalConfig)
	if res.code != 1 || !strings.Contains(res.stdout, "error: hooks.identify: pre_tool_execution http hooks are failed closed") ||
		!strings.Contains(res.stdout, "role: hooks") || !strings.Contains(res.stdout, "hooks.runtime_auth") {
		t.Errorf("no way to identify the runtime: %s, want exit 1 and an error naming both fixes", res)
	}
	withListener := strings.Replace(minimalConfig, "listeners: [{name: sandbox, address: 127.0.0.1:15001}]",
		"listeners: [{name: sandbox, address: 127.0.0.1:15001}, {name: hooks, address: 127.0.0.1:15003, role: hooks}]", 1)
	withAuth := minimalConfig + "hooks: {runtime_auth: {credential: runtime-token}}\n"
	for name, yaml := range map[string]string{"hooks listener": withListener, "runtime auth": withAuth} {
		if res := check(yaml); res.code != 0 || strings.Contains(res.stdout, "hooks.identify") {
			t.Errorf("%s: %s, want exit 0 and nothing about hooks.identify", name, res)
		}
	}
	res = check(minimalConfig + "hooks: {identify: url}\n")
	if res.code != 0 || !strings.Contains(res.stdout, "warning: hooks.identify: url: any listener's traffic to a hook URL") {
		t.Errorf("identify url: %s, want exit 0 and a warning saying what it costs", res)
	}
}
