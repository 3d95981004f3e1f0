package allowlist

import (
	"testing"
)

type decideCase struct {
	authority string // parsed with ParseAuthority(authority, 443)
	reason    Reason
	rule      string // winning pattern, "" for none
	intercept bool
}

func runDecideCases(t *testing.T, p *Policy, cases []decideCase) {
	t.Helper()
	for _, tt := range cases {
		target, err := ParseAuthority(tt.authority, 443)
		if err != nil {
			t.Fatalf("ParseAuthority(%q): %v", tt.authority, err)
		}
		d := p.Decide(target)
		if d.Reason != tt.reason || d.RuleName() != tt.rule || d.Intercept != tt.intercept || d.Target != target {
			t.Errorf("Decide(%q) = reason %q rule %q intercept %v; want %q %q %v",
				tt.authority, d.Reason, d.RuleName(), d.Intercept, tt.reason, tt.rule, tt.intercept)
		}
		if d.Allowed() != (tt.reason == ReasonNone) {
			t.Errorf("Decide(%q).Allowed() = %v", tt.authority, d.Allowed())
		}
	}
}

func TestDecideWildcardLabelBoundary(t *testing.T) {
	p := mustCompile(t, []Entry{{Domain: "*.example.com"}}, Options{})
	runDecideCases(t, p, []decideCase{
		{"a.example.com", ReasonNone, "*.example.com", false},
		{"a.b.example.com", ReasonNone, "*.example.com", false},
		{"A.Example.Com.", ReasonNone, "*.example.com", false},
		{"EXAMPLE.COM.", ReasonNotAllowlisted, "", false},
		{"example.com", ReasonNotAllowlisted, "", false},
		{"badexample.com", ReasonNotAllowlisted, "", false},
		{"example.com.evil.test", ReasonNotAllowlisted, "", false},
		{"a.example.co", ReasonNotAllowlisted, "", false},
		{"com", ReasonNotAllowlisted, "", false},
	})
}

// The most specific rule wins, and headers come only from the winner: the
// "*" rule never carries api.github.com's credential.
func TestDecideMostSpecificWins(t *testing.T) {
	p := mustCompile(t, []Entry{
		{Domain: "*"},
		{Domain: "*.github.com"},
		{Domain: "api.github.com", Credential: "github-token"},
		{Domain: "*.api.github.com"},
	}, Options{})
	runDecideCases(t, p, []decideCase{
		{"api.github.com", ReasonNone, "api.github.com", true},
		{"x.api.github.com", ReasonNone, "*.api.github.com", false},
		{"y.x.api.github.com", ReasonNone, "*.api.github.com", false},
		{"raw.github.com", ReasonNone, "*.github.com", false},
		{"github.com", ReasonNone, "*", false},
		{"other.test", ReasonNone, "*", false},
		{"10.0.0.1", ReasonNone, "*", false}, // "*" matches IP literals; netguard judges them next
		{"[::1]", ReasonNone, "*", false},
	})
	for _, host := range []string{"github.com", "other.test", "x.api.github.com"} {
		d := p.Decide(Target{Host: host, Port: 443})
		if d.Rule.Credential != "" || d.Rule.Injects() {
			t.Errorf("Decide(%q) carries a credential from rule %q", host, d.RuleName())
		}
	}
}

func TestDecidePorts(t *testing.T) {
	p := mustCompile(t, []Entry{
		{Domain: "pypi.org", Ports: []uint16{443}},
		{Domain: "*.pypi.org"},
		{Domain: "alt.test", Ports: []uint16{8080}},
	}, Options{DefaultPorts: []uint16{443, 8443}})
	runDecideCases(t, p, []decideCase{
		{"pypi.org:443", ReasonNone, "pypi.org", false},
		{"pypi.org:80", ReasonPortNotAllowed, "pypi.org", false},
		{"files.pypi.org:8443", ReasonNone, "*.pypi.org", false},
		{"files.pypi.org:80", ReasonPortNotAllowed, "*.pypi.org", false}, // defaults replaced by Options
		{"alt.test:8080", ReasonNone, "alt.test", false},
		{"alt.test:443", ReasonPortNotAllowed, "alt.test", false},
		{"evil.test:8080", ReasonNotAllowlisted, "", false}, // host is checked before port
	})
	q := mustCompile(t, []Entry{{Domain: "a.test"}}, Options{})
	runDecideCases(t, q, []decideCase{
		{"a.test:80", ReasonNone, "a.test", false},
		{"a.test:443", ReasonNone, "a.test", false},
		{"a.test:8080", ReasonPortNotAllowed, "a.test", false},
	})
}

// An IP-literal entry matches only that address, in any spelling.
func TestDecideIPLiterals(t *testing.T) {
	p := mustCompile(t, []Entry{{Domain: "10.1.2.3"}, {Domain: "[2001:db8::1]"}}, Options{})
	runDecideCases(t, p, []decideCase{
		{"10.1.2.3", ReasonNone, "10.1.2.3", false},
		{"10.1.515", ReasonNone, "10.1.2.3", false},
		{"0xa.0x1.0x2.0x3", ReasonNone, "10.1.2.3", false},
		{"167838211", ReasonNone, "10.1.2.3", false},
		{"[2001:DB8:0::1]", ReasonNone, "2001:db8::1", false},
		{"10.1.2.4", ReasonNotAllowlisted, "", false},
		{"[::ffff:10.1.2.3]", ReasonNotAllowlisted, "", false}, // mapped stays IPv6: no match, fail closed
	})
}

func TestDecideInterceptModes(t *testing.T) {
	entries := []Entry{
		{Domain: "plain.test"},
		{Domain: "tok.test", Transform: []Header{{Name: "Authorization", Value: "Bearer x"}}},
		{Domain: "cred.test", Credential: "c"},
	}
	runDecideCases(t, mustCompile(t, entries, Options{Intercept: InterceptAuto}), []decideCase{
		{"plain.test", ReasonNone, "plain.test", false},
		{"tok.test", ReasonNone, "tok.test", true},
		{"cred.test", ReasonNone, "cred.test", true},
		{"cred.test:8080", ReasonPortNotAllowed, "cred.test", false}, // denied: never intercepted
	})
	runDecideCases(t, mustCompile(t, entries, Options{Intercept: InterceptAll}), []decideCase{
		{"plain.test", ReasonNone, "plain.test", true},
		{"tok.test", ReasonNone, "tok.test", true},
		{"nope.test", ReasonNotAllowlisted, "", false},
	})
	runDecideCases(t, mustCompile(t, entries[:1], Options{Intercept: InterceptNone}), []decideCase{
		{"plain.test", ReasonNone, "plain.test", false},
	})
}

func TestDecideEmptyPolicyAndBadTarget(t *testing.T) {
	p := mustCompile(t, nil, Options{})
	if d := p.Decide(Target{Host: "a.test", Port: 443}); d.Reason != ReasonNotAllowlisted || d.Rule != nil {
		t.Errorf("empty policy: %+v", d)
	}
	q := mustCompile(t, []Entry{{Domain: "*"}}, Options{})
	if d := q.Decide(Target{Port: 443}); d.Reason != ReasonBadRequest || d.Rule != nil {
		t.Errorf("empty host: %+v", d)
	}
}

// Decide runs on every request: it must not allocate.
func TestDecideDoesNotAllocate(t *testing.T) {
	p, targets := benchPolicy(t, 1000)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		_ = p.Decide(targets[i%len(targets)])
		i++
	})
	if allocs != 0 {
		t.Errorf("Decide allocates %.1f times per call; want 0", allocs)
	}
}

// A Policy is shared by every connection; run under -race.
func TestDecideConcurrent(t *testing.T) {
	p, targets := benchPolicy(t, 300)
	want := make([]Decision, len(targets))
	for i, target := range targets {
		want[i] = p.Decide(target)
	}
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i, target := range targets {
				if got := p.Decide(target); got != want[i] {
					t.Errorf("Decide(%v) = %+v; want %+v", target, got, want[i])
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}

func TestDecideRequestPlaintextCredential(t *testing.T) {
	p, err := Compile([]Entry{
		{Domain: "api.example.com", Credential: "example-api"},
		{Domain: "legacy.example.com", Transform: []Header{{Name: "X-Key", Value: "v"}}, AllowPlaintext: true},
		{Domain: "plain.example.com"},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		host, scheme string
		port         uint16
		want         Reason
	}{
		{"api.example.com", "http", 80, ReasonPlaintextCredential},
		{"api.example.com", "https", 443, ReasonNone},
		{"api.example.com", "", 443, ReasonNone},
		{"api.example.com", "http", 8080, ReasonPortNotAllowed}, // port is checked first
		{"legacy.example.com", "http", 80, ReasonNone},
		{"plain.example.com", "http", 80, ReasonNone},
		{"other.example.com", "http", 80, ReasonNotAllowlisted},
	}
	for _, c := range cases {
		d := p.DecideRequest(Target{Host: c.host, Port: c.port}, c.scheme)
		if d.Reason != c.want {
			t.Errorf("%s://%s:%d: reason %q, want %q", c.scheme, c.host, c.port, d.Reason, c.want)
		}
		if d.Reason == ReasonPlaintextCredential && d.Intercept {
			t.Errorf("%s: a refused request is not intercepted", c.host)
		}
	}
}
