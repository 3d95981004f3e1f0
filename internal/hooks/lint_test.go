package hooks

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// Golden lint tests: every testdata/lint/NAME.json is a hooks.json, linted against
// testPolicy with hooks.fail_closed on (off for names containing "fail_open");
// NAME.golden holds the findings, one per line ("severity path: message"), or
// "no findings". `go test ./internal/hooks -update` rewrites them; review the diff.

var update = flag.Bool("update", false, "rewrite the golden files")

// testPolicy is the allowlist the golden cases are judged against.
func testPolicy(t testing.TB) *allowlist.Policy {
	t.Helper()
	p, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "policy.example.com", Credential: "hooks-policy"},
		{Domain: "audit.example.com"},
		{Domain: "*.example.org", Ports: []uint16{443}},
		{Domain: "10.0.0.5"},
		{Domain: "169.254.169.254"},
		{Domain: "::1", Ports: []uint16{8080}},
		{Domain: "127.0.0.1"},
	}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLintGolden(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/lint/*.json")
	if len(inputs) < 10 {
		t.Fatalf("only %d golden lint cases", len(inputs))
	}
	policy := testPolicy(t)
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".json")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got := renderFindings(LintJSON(data, LintOptions{Policy: policy, FailClosed: !strings.Contains(name, "fail_open")}))
			golden := strings.TrimSuffix(in, ".json") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("findings differ from %s\n--- got\n%s--- want\n%s", golden, got, want)
			}
		})
	}
}

func renderFindings(fs []Finding) string {
	if len(fs) == 0 {
		return "no findings\n"
	}
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(string(f.Severity) + " " + f.String() + "\n")
	}
	return b.String()
}

func TestLintHonoursAllowCIDRs(t *testing.T) {
	doc := []byte(`{"g": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "http://10.0.0.5/hooks/pre", "timeout": 10},
		{"type": "http", "url": "http://169.254.169.254/x", "timeout": 10}]}]}}`)
	guard, err := netguard.New(netguard.Options{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	got := renderFindings(LintJSON(doc, LintOptions{Policy: testPolicy(t), Guard: guard, FailClosed: true}))
	want := "error g.pre_tool_execution[0].hooks[1].url: 169.254.169.254 is an internal address (metadata): " +
		"the address guard refuses it; use the endpoint's public name\n"
	if got != want {
		t.Errorf("got\n%s\nwant (10.0.0.5 opened by allow_cidrs, metadata never)\n%s", got, want)
	}
}

func TestLintWithoutPolicySkipsAllowlist(t *testing.T) {
	doc := []byte(`{"g": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://anything.example/", "timeout": 10}]}]}}`)
	if fs := LintJSON(doc, LintOptions{FailClosed: true}); len(fs) != 0 {
		t.Errorf("%v", fs)
	}
}

func TestLintPolicy(t *testing.T) {
	p, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "*", Credential: "shared"},
		{Domain: "*.com", Transform: []allowlist.Header{{Name: "Authorization", Value: "Bearer x"}}},
		{Domain: "*.co.uk", Transform: []allowlist.Header{{Name: "X-Team", Value: "q8ZLx2VbN0rT5mWc7YfK3hJd9GsPaE4u"}}},
		{Domain: "*.github.io", Credential: "pages"},
		{Domain: "*.github.com", Credential: "gh"},                                           // one registrable domain
		{Domain: "*.test", Transform: []allowlist.Header{{Name: "X-Env", Value: "staging"}}}, // not auth-bearing
		{Domain: "api.example.com", Credential: "api"},
	}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := renderFindings(LintPolicy(p.Rules()))
	for _, want := range []string{
		`warning [0].credential: credential shared on "*" is sent to every host, IP literals included`,
		`warning [1].transform: transform header Authorization on "*.com" is sent to every domain under the public suffix "com"`,
		`warning [2].transform: transform header X-Team on "*.co.uk"`,
		`warning [3].credential: credential pages on "*.github.io"`,
		// Inline secrets, on any entry: the same shapes the hooks.json header lint refuses.
		`warning [1].transform.Authorization: header Authorization: its value looks like`,
		`warning [2].transform.X-Team: header X-Team: its value looks like`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 6 {
		t.Errorf("%d findings, want 6:\n%s", n, got)
	}
	if strings.Contains(got, "q8ZLx2V") || strings.Contains(got, "Bearer x") {
		t.Errorf("a finding shows a header value:\n%s", got)
	}
}

// TestLintMisspeltEvent: a typo in an event name turns the gate off without a word
// from the runtime, so it is an error with the fix; the secret in the hooks under it
// is still reported.
func TestLintMisspeltEvent(t *testing.T) {
	got := renderFindings(LintJSON([]byte(`{"security-gate": {
  "pre_tool_executon": [{"matcher": "*", "hooks": [{"type": "http", "url": "https://policy.example.com/pre",
    "timeout": 5, "headers": {"Authorization": "Bearer abc"}}]}],
  "PreToolUse": [],
  "enabeld": false,
  "note": "kept"}}`), LintOptions{FailClosed: true}))
	for _, want := range []string{
		`error security-gate.pre_tool_executon: unknown event; did you mean "pre_tool_execution"?`,
		`error security-gate.pre_tool_executon[0].hooks[0].headers.Authorization: header Authorization`,
		`error security-gate.PreToolUse: unknown event; the events are pre_tool_execution and post_tool_execution`,
		`error security-gate.enabeld: unknown key; did you mean "enabled"?`,
		`warning security-gate.note: unknown key`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "abc") {
		t.Errorf("a finding shows the secret:\n%s", got)
	}
}

// TestLintJSONErrorPosition: a JSON error names its line and column.
func TestLintJSONErrorPosition(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"{\"g\": {\"pre_tool_execution\": [\n  {\"matcher\": \"*\",, }]}}", "(line 2, column 19)"},
		{"{\"g\": {}\n}\n}", "(line 3, column 1)"},
		{"{\"g\": {\n", "(line 2, column 1)"},
	} {
		got := renderFindings(LintJSON([]byte(tc.doc), LintOptions{}))
		if !strings.Contains(got, tc.want) {
			t.Errorf("%q: %s, want %s", tc.doc, got, tc.want)
		}
	}
}
