package hooks

import (
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// docsExample is hooks.json in the shapes of the managed-agent documentation: a
// security gate on code_execution (an http pre hook), audit logging of file tools (an
// http post hook), a "*" matcher, a command hook and a disabled group.
const docsExample = `{
  "security-gate": {
    "pre_tool_execution": [
      {"matcher": "code_execution", "hooks": [
        {"type": "http", "url": "https://policy.example.com/hooks/pre", "timeout": 10,
         "headers": {"Content-Type": "application/json"}}
      ]}
    ]
  },
  "audit-logging": {
    "enabled": true,
    "post_tool_execution": [
      {"matcher": "view_file|write_to_file|replace_file_content", "hooks": [
        {"type": "http", "url": "https://audit.example.com/events"}
      ]}
    ]
  },
  "everything": {
    "pre_tool_execution": [
      {"matcher": "*", "hooks": [
        {"type": "command", "command": "python3 /.agents/hooks-scripts/gate.py", "timeout": 2.5}
      ]}
    ]
  },
  "old-gate": {
    "enabled": false,
    "pre_tool_execution": [
      {"matcher": "code_execution", "hooks": [{"type": "http", "url": "https://old.example.com/pre"}]}
    ]
  }
}`

func mustParse(t *testing.T, doc string) *File {
	t.Helper()
	f, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return f
}

func TestParseDocsShapes(t *testing.T) {
	f := mustParse(t, docsExample)
	var names []string
	for _, g := range f.Groups {
		names = append(names, g.Name)
	}
	if got := strings.Join(names, ","); got != "security-gate,audit-logging,everything,old-gate" {
		t.Fatalf("groups %s, want document order", got)
	}
	gate := f.Groups[0]
	if !gate.Enabled || len(gate.Pre) != 1 || len(gate.Post) != 0 {
		t.Fatalf("security-gate: %+v", gate)
	}
	h := gate.Pre[0].Hooks[0]
	if gate.Pre[0].Matcher != "code_execution" || h.Type != TypeHTTP || h.Timeout != 10*time.Second || !h.TimeoutSet ||
		h.Scheme != "https" || h.Target.Host != "policy.example.com" || h.Target.Port != 443 || h.PPath != "/hooks/pre" ||
		len(h.Headers) != 1 || h.Headers[0].Name != "Content-Type" {
		t.Errorf("security-gate hook: %+v", h)
	}
	if h.Path != "security-gate.pre_tool_execution[0].hooks[0]" {
		t.Errorf("path %q", h.Path)
	}
	audit := f.Groups[1].Post[0]
	if audit.Matcher != "view_file|write_to_file|replace_file_content" || audit.Hooks[0].Timeout != DefaultTimeout || audit.Hooks[0].TimeoutSet {
		t.Errorf("audit-logging: %+v", audit)
	}
	cmd := f.Groups[2].Pre[0]
	if cmd.Matcher != "*" || cmd.Hooks[0].Type != TypeCommand || cmd.Hooks[0].Timeout != 2500*time.Millisecond {
		t.Errorf("command hook: %+v", cmd)
	}
	if f.Groups[3].Enabled {
		t.Error("old-gate: enabled, want disabled")
	}
	if len(f.Unknown) != 0 {
		t.Errorf("unknown keys %v", f.Unknown)
	}
}

func TestParseKeepsUnknownKeys(t *testing.T) {
	f := mustParse(t, `{"g": {"note": 1, "pre_tool_execution": [{"matcher": "code_execution", "x": 1,
		"hooks": [{"type": "http", "url": "https://policy.example.com/", "retries": 3}]}]}, "h": {"on_stop": []}}`)
	want := "g.note g.pre_tool_execution[0].x g.pre_tool_execution[0].hooks[0].retries h.on_stop"
	if got := strings.Join(f.Unknown, " "); got != want {
		t.Errorf("unknown %q, want %q", got, want)
	}
}

func TestParseErrorsCarryPaths(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`[]`, "\n  expected an object of group name"},
		{`{"g": 1}`, `g: expected a group`},
		{`{"g": {"enabled": 1}}`, `g.enabled: expected true or false, got a number`},
		{`{"g": {"pre_tool_execution": {}}}`, `g.pre_tool_execution: expected a list`},
		{`{"g": {"pre_tool_execution": [1]}}`, `g.pre_tool_execution[0]: expected a rule`},
		{`{"g": {"pre_tool_execution": [{"matcher": []}]}}`, `g.pre_tool_execution[0].matcher: expected a string`},
		{`{"g": {"pre_tool_execution": [{"matcher": "x"}]}}`, `g.pre_tool_execution[0].hooks: required`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "http", "url": 7}]}]}}`, `g.post_tool_execution[0].hooks[0].url: expected a string, got a number`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "http", "url": "/relative"}]}]}}`, `hooks[0].url: "/relative" is not an absolute`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "http", "url": "https://a b/"}]}]}}`, `hooks[0].url: not a URL`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "http", "url": "https://x/", "timeout": 0}]}]}}`, `hooks[0].timeout: must be a positive number`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "http", "url": "https://x/", "headers": []}]}]}}`, `hooks[0].headers: expected an object`},
		{`{"g": {"post_tool_execution": [{"hooks": [{"type": "sql"}]}]}}`, `hooks[0].type: unknown hook type "sql"`},
		{`{"g.x": {"enabled": null}}`, `["g.x"].enabled: expected true or false, got null`},
		{`{"g": {}} {}`, `not a JSON document: data after the JSON document`},
		{`{"g": {"enabled": tru}}`, `not a JSON document`},
		{``, `not a JSON document: unexpected end of JSON input`},
	} {
		_, err := Parse([]byte(tc.doc))
		var perr *ParseError
		if !errors.As(err, &perr) {
			t.Errorf("%s: error %v, want a *ParseError", tc.doc, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error\n%v\nwant it to contain %q", tc.doc, err, tc.want)
		}
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	data, err := os.ReadFile("testdata/lint/parse_errors.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse(data)
	var perr *ParseError
	if !errors.As(err, &perr) || len(perr.Problems) < 15 {
		t.Fatalf("want every problem at once, got %v", err)
	}
}

func TestParseNullEventIsEmpty(t *testing.T) {
	f := mustParse(t, `{"g": {"pre_tool_execution": null}}`)
	if len(f.Groups) != 1 || f.Groups[0].Pre != nil {
		t.Errorf("%+v", f.Groups)
	}
}

func TestParseDeepNestingIsBounded(t *testing.T) {
	doc := `{"g": {"x": ` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`
	if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("err %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(docsExample))
	f.Add([]byte(`{"g": {"pre_tool_execution": [{"matcher": "*_file", "hooks": [{"type": "http", "url": "http://[::1]:8080/x?y"}]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		ix := NewIndex(file)
		for _, m := range ix.Matches() {
			if m.Audience == "" || (m.Event != EventPre && m.Event != EventPost) {
				t.Fatalf("bad match %+v", m)
			}
			lookupAsWritten(t, ix, m)
		}
		_ = Lint(file, LintOptions{FailClosed: true})
	})
}

// lookupAsWritten checks that a request for the URL as hooks.json writes it is the
// hook call, whatever spelling normalisation changed.
func lookupAsWritten(t *testing.T, ix *Index, m Match) {
	u, err := url.Parse(m.URL)
	if err != nil {
		t.Fatalf("indexed URL %q does not parse: %v", m.URL, err)
	}
	scheme := strings.ToLower(u.Scheme)
	tg, err := allowlist.ParseAuthority(u.Host, defaultPort(scheme))
	if err != nil {
		t.Fatalf("indexed URL %q: %v", m.URL, err)
	}
	if _, ok := ix.Lookup(scheme, tg.Host, tg.Port, u.EscapedPath()); !ok {
		t.Fatalf("a call to %q as written is not recognised", m.URL)
	}
}
