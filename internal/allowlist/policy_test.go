package allowlist

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestCompileNormalisesPatterns(t *testing.T) {
	entries := []Entry{
		{Domain: "*"},
		{Domain: "*.Example.COM."},
		{Domain: "Bücher.example."},
		{Domain: "0x0a.1.2.3"},
		{Domain: "[::1]"},
		{Domain: "2001:DB8::1"},
		{Domain: "*.com"}, // allowed here; the config linter warns
	}
	p := mustCompile(t, entries, Options{})
	var got []string
	for _, r := range p.Rules() {
		got = append(got, r.Pattern)
	}
	want := []string{"*", "*.example.com", "xn--bcher-kva.example", "10.1.2.3", "::1", "2001:db8::1", "*.com"}
	if !slices.Equal(got, want) {
		t.Errorf("patterns = %q; want %q", got, want)
	}
}

func TestCompilePortsAndHeaders(t *testing.T) {
	p := mustCompile(t, []Entry{
		{Domain: "a.test"},
		{Domain: "b.test", Ports: []uint16{8443, 443, 443}},
		{Domain: "c.test", Transform: []Header{{Name: "x-api-key", Value: "s"}}, Credential: "team/api-key"},
	}, Options{DefaultPorts: []uint16{443, 80}})
	rules := p.Rules()
	if !slices.Equal(rules[0].Ports, []uint16{80, 443}) || !slices.Equal(rules[1].Ports, []uint16{443, 8443}) {
		t.Errorf("ports = %v, %v; want [80 443], [443 8443]", rules[0].Ports, rules[1].Ports)
	}
	if rules[2].Transform[0].Name != "X-Api-Key" || !rules[2].Injects() || rules[0].Injects() {
		t.Errorf("transform = %+v, injects = %v/%v", rules[2].Transform, rules[2].Injects(), rules[0].Injects())
	}
}

// Every invalid entry is reported at once, each with its index, field and
// a message that names the fix.
func TestCompileErrors(t *testing.T) {
	entries := []Entry{
		/* 0 */ {Domain: ""},
		/* 1 */ {Domain: "*example.com"},
		/* 2 */ {Domain: "a.*.b"},
		/* 3 */ {Domain: "*.*.com"},
		/* 4 */ {Domain: "**"},
		/* 5 */ {Domain: "https://x.test/path"},
		/* 6 */ {Domain: "x.test/y"},
		/* 7 */ {Domain: "x.test:443"},
		/* 8 */ {Domain: "ok.test", Ports: []uint16{0}},
		/* 9 */ {Domain: "OK.test."},
		/* 10 */ {Domain: "h.test", Transform: []Header{{Name: "Bad Name", Value: "v"}, {Name: "X-Token", Value: "sec\r\nret"}}},
		/* 11 */ {Domain: "h2.test", Transform: []Header{{Name: "Connection", Value: "close"}, {Name: "proxy-authorization", Value: "x"}, {Name: "te", Value: "x"}}},
		/* 12 */ {Domain: "h3.test", Transform: []Header{{Name: "Host", Value: "x"}, {Name: "content-length", Value: "1"}, {Name: "egressd-reason", Value: "x"}}},
		/* 13 */ {Domain: "c.test", Credential: "-bad"},
		/* 14 */ {Domain: "c2.test", Credential: "a/../../sys"},
		/* 15 */ {Domain: "*.10.0.0.1"},
		/* 16 */ {Domain: ".example.com"},
		/* 17 */ {Domain: "[::1]:443"},
		/* 18 */ {Domain: "p.test", Ports: []uint16{}},
		/* 19 */ {Domain: "a..b"},
		/* 20 */ {Domain: "*."},
		/* 21 */ {Domain: "d.test", Transform: []Header{{Name: "X-A", Value: "1"}, {Name: "x-a", Value: "2"}}},
		/* 22 */ {Domain: "127.1"},
		/* 23 */ {Domain: "127.0.0.1"},
		/* 24 */ {Domain: "example.123"},
		/* 25 */ {Domain: "x.test:https"},
	}
	want := []struct {
		index      int
		field, msg string
	}{
		{0, "domain", `domain is empty; use "example.com", "*.example.com" or "*"`},
		{1, "domain", `invalid wildcard "*example.com"; use "*.example.com" for every subdomain of example.com`},
		{2, "domain", `invalid wildcard "a.*.b"; "*" is allowed only alone or as a leading "*.", e.g. "*.example.com" for every subdomain of example.com`},
		{3, "domain", `invalid wildcard "*.*.com"`},
		{4, "domain", `invalid wildcard "**"`},
		{5, "domain", `"https://x.test/path" contains a scheme; use just the host name, e.g. "x.test"`},
		{6, "domain", `"x.test/y" contains a path; use just the host name, e.g. "x.test"`},
		{7, "domain", `"x.test:443" contains a port; remove it and use "ports": [443]`},
		{8, "ports", `port 0 is not valid; use 1-65535`},
		{9, "domain", `"OK.test." duplicates entry 8 ("ok.test"); merge the two entries`},
		{10, "transform", `header name "Bad" is not a valid RFC 9110 token: it continues with ' ' at byte 3 (the rest is not shown)`},
		{10, "transform", `the value of header "X-Token" contains CR, LF, NUL or another control character (value not shown); remove it`},
		{11, "transform", `header "Connection" cannot be injected: it is a hop-by-hop header`},
		{11, "transform", `header "Proxy-Authorization" cannot be injected: it is a hop-by-hop header`},
		{11, "transform", `header "Te" cannot be injected: it is a hop-by-hop header`},
		{12, "transform", `header "Host" cannot be injected: egressd sets Host`},
		{12, "transform", `header "Content-Length" cannot be injected`},
		{12, "transform", `header "Egressd-Reason" cannot be injected: the Egressd- prefix is reserved`},
		{13, "credential", `credential ID "-bad" is invalid`},
		{14, "credential", `credential ID "a/../../sys" is invalid`},
		{15, "domain", `wildcard "*.10.0.0.1" covers an IP address; list the address itself, e.g. "10.0.0.1"`},
		{16, "domain", `".example.com" starts with a dot; use "*.example.com" for its subdomains or "example.com" for the host itself`},
		{17, "domain", `"[::1]:443" contains a port; remove it and use "ports": [443]`},
		{18, "ports", `ports is empty; omit it to use network.default_ports`},
		{19, "domain", `"a..b" has an empty label`},
		{20, "domain", `wildcard "*." has no domain`},
		{21, "transform", `header "X-A" is set twice; set it once`},
		{23, "domain", `"127.0.0.1" duplicates entry 22 ("127.0.0.1")`},
		{24, "domain", `"example.123" ends in a number but is not a valid IPv4 address`},
		{25, "domain", `"x.test:https" contains ":"; use just the host name`},
	}
	problems := compileProblems(t, entries, Options{})
	if len(problems) != len(want) {
		t.Errorf("got %d problems; want %d:\n%s", len(problems), len(want), joinProblems(problems))
	}
	for i := range min(len(problems), len(want)) {
		got, w := problems[i], want[i]
		if got.Index != w.index || got.Field != w.field || !strings.HasPrefix(got.Msg, w.msg) {
			t.Errorf("problem %d = %d %s %q; want %d %s %q...", i, got.Index, got.Field, got.Msg, w.index, w.field, w.msg)
		}
	}
}

// A header value is a secret: no message may contain it.
func TestCompileErrorsNeverEchoValues(t *testing.T) {
	const secret = "sk-live-SECRET"
	err := compileErr(t, []Entry{{Domain: "a.test", Transform: []Header{
		{Name: "Authorization", Value: "Bearer " + secret + "\n"},
		{Name: "Bad Name", Value: secret},
		{Name: "Connection", Value: secret},
		{Name: "Authorization: Bearer " + secret, Value: ""}, // a value pasted into the name
	}}}, Options{})
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the header value: %v", err)
	}
}

func TestCompileOptionErrors(t *testing.T) {
	problems := compileProblems(t, []Entry{
		{Domain: "a.test", Credential: "api"},
		{Domain: "b.test", Transform: []Header{{Name: "X-Key", Value: "v"}}},
		{Domain: "c.test"},
	}, Options{Intercept: "none", DefaultPorts: []uint16{0, 443}})
	want := []string{
		"network.default_ports: port 0 is not valid; use 1-65535",
		"allowlist[0].credential: tls.intercept none cannot inject headers for entry 0; set tls.intercept to auto or remove the entry's transform and credential",
		"allowlist[1].transform: tls.intercept none cannot inject headers for entry 1; set tls.intercept to auto or remove the entry's transform and credential",
	}
	if got := problemStrings(problems); !slices.Equal(got, want) {
		t.Errorf("problems =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	problems = compileProblems(t, nil, Options{Intercept: "sometimes"})
	if got := problemStrings(problems); len(got) != 1 || got[0] != `tls.intercept: unknown mode "sometimes"; use auto, all or none` {
		t.Errorf("problems = %q", got)
	}
}

func TestCompileErrorRendering(t *testing.T) {
	err := compileErr(t, []Entry{{Domain: ""}, {Domain: "x:1"}}, Options{})
	want := "invalid allowlist (2 problems):\n" +
		`  allowlist[0].domain: domain is empty; use "example.com", "*.example.com" or "*"` + "\n" +
		`  allowlist[1].domain: "x:1" contains a port; remove it and use "ports": [1]`
	if err.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", err, want)
	}
	var ee EntryError
	if !errors.As(err, &ee) || ee.Index != 0 || ee.Field != "domain" {
		t.Errorf("errors.As(EntryError) = %+v", ee)
	}
}

func TestValidCredentialID(t *testing.T) {
	valid := []string{"a", "hooks-policy", "team/api.key_v2", "A9", strings.Repeat("a", 128)}
	invalid := []string{"-a", ".a", "/a", "a/", "a//b", "a/./b", "a/../b", "a b", "a:b", "ü", strings.Repeat("a", 129)}
	for _, id := range valid {
		if !validCredentialID(id) {
			t.Errorf("validCredentialID(%q) = false", id)
		}
	}
	for _, id := range invalid {
		if validCredentialID(id) {
			t.Errorf("validCredentialID(%q) = true", id)
		}
	}
}

func mustCompile(t testing.TB, entries []Entry, opts Options) *Policy {
	t.Helper()
	p, err := Compile(entries, opts)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

func compileErr(t *testing.T, entries []Entry, opts Options) *CompileError {
	t.Helper()
	p, err := Compile(entries, opts)
	var ce *CompileError
	if p != nil || !errors.As(err, &ce) {
		t.Fatalf("Compile = %v, %v; want a *CompileError", p, err)
	}
	return ce
}

func compileProblems(t *testing.T, entries []Entry, opts Options) []EntryError {
	t.Helper()
	return compileErr(t, entries, opts).Problems
}

func problemStrings(problems []EntryError) []string {
	var s []string
	for _, p := range problems {
		s = append(s, p.Error())
	}
	return s
}

func joinProblems(problems []EntryError) string {
	return strings.Join(problemStrings(problems), "\n")
}

// Printing or marshalling a rule shows header names, never values.
func TestHeaderRedaction(t *testing.T) {
	const secret = "sk-live-SECRET"
	p := mustCompile(t, []Entry{{Domain: "a.test", Transform: []Header{{Name: "Authorization", Value: secret}}}}, Options{})
	r := p.Rules()[0]
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(r), fmt.Sprintf("%+v", *r), fmt.Sprintf("%#v", *r), string(js)} {
		if strings.Contains(s, secret) || !strings.Contains(s, "Authorization") {
			t.Errorf("rendered rule %s: leaks the value or lacks the name", s)
		}
	}
	if r.Transform[0].Value != secret {
		t.Errorf("Value = %q; the injector needs the real value", r.Transform[0].Value)
	}
}
