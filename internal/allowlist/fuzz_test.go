package allowlist

import (
	"math"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzNormalizeHost checks that normalisation never panics and that its
// output is canonical: idempotent, lower-case ASCII, and for IPs exactly
// Addr.String().
func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{
		"example.com", "EXAMPLE.COM.", "bücher.example", "xn--bcher-kva.example", "127.1", "0x7f.0.0.1",
		"0177.0.0.1", "2130706433", "[::ffff:127.0.0.1]", "fe80::1%eth0", "1.2.3.4.5", "example.123",
		"a..b", "ｅｘａｍｐｌｅ。com", "xn--", "_x.test", "r3---sn.test", "0x.0x", "\u200d.test",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		host, addr, err := NormalizeHost(raw)
		if err != nil {
			return
		}
		checkCanonicalHost(t, raw, host)
		if addr.IsValid() && addr.String() != host {
			t.Fatalf("NormalizeHost(%q): addr %v but host %q", raw, addr, host)
		}
		host2, addr2, err := NormalizeHost(host)
		if err != nil || host2 != host || addr2 != addr {
			t.Fatalf("not idempotent: %q -> %q (%v) -> %q (%v, %v)", raw, host, addr, host2, addr2, err)
		}
	})
}

func checkCanonicalHost(t *testing.T, raw, host string) {
	t.Helper()
	if host == "" || strings.ToLower(host) != host || strings.HasSuffix(host, ".") {
		t.Fatalf("NormalizeHost(%q) = %q: not canonical", raw, host)
	}
	for _, c := range []byte(host) {
		if c >= utf8.RuneSelf {
			t.Fatalf("NormalizeHost(%q) = %q: not ASCII", raw, host)
		}
	}
}

// FuzzParseAuthority checks that a parsed target prints as an authority that
// parses back to the same target.
func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"example.com:443", "[::1]:80", "::1", "host:", ":443", "[::1", "user@h:1", "127.1:08"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		target, err := ParseAuthority(s, 443)
		if err != nil {
			return
		}
		again, err := ParseAuthority(target.String(), 0)
		if err != nil || again != target || target.Port == 0 {
			t.Fatalf("ParseAuthority(%q) = %+v; String %q parses to %+v, %v", s, target, target.String(), again, err)
		}
	})
}

// FuzzDecide compares Decide with a linear-scan reference over the same
// rules. patterns is a comma-separated allowlist; odd entries allow only
// port 8443, every third entry has a credential.
func FuzzDecide(f *testing.F) {
	f.Add("*.example.com,api.example.com,*", "a.api.example.com", uint16(443))
	f.Add("*.example.com", "badexample.com", uint16(443))
	f.Add("*,*.github.com,api.github.com,*.api.github.com", "x.api.github.com", uint16(8443))
	f.Add("10.1.2.3,*.com", "10.1.515", uint16(80))
	f.Add("bücher.example,*.example", "xn--bcher-kva.example", uint16(443))
	f.Fuzz(func(t *testing.T, patterns, rawHost string, port uint16) {
		p := compileValid(t, strings.Split(patterns, ","))
		for _, raw := range decideHosts(p, rawHost) {
			host, addr, err := NormalizeHost(raw)
			if err != nil {
				continue
			}
			target := Target{Host: host, Addr: addr, Port: port}
			got := p.Decide(target)
			reason, rule := referenceDecide(p.Rules(), target)
			if got.Reason != reason || got.Rule != rule || got.Intercept != (reason == ReasonNone && rule.Injects()) {
				t.Fatalf("Decide(%+v) = %q %q %v; reference %q %q", target, got.Reason, got.RuleName(), got.Intercept, reason, ruleName(rule))
			}
		}
	})
}

// decideHosts returns rawHost plus hosts built from each rule's pattern, so
// that the fuzzer reaches matches, near misses and nested wildcards often.
func decideHosts(p *Policy, rawHost string) []string {
	hosts := []string{rawHost}
	for _, r := range p.Rules() {
		base := strings.TrimPrefix(r.Pattern, "*.")
		hosts = append(hosts, base, "a."+base, rawHost+"."+base, rawHost+base)
	}
	return hosts
}

// compileValid compiles the domains that are valid and not duplicates.
func compileValid(t *testing.T, domains []string) *Policy {
	var entries []Entry
	seen := map[string]bool{}
	for _, d := range domains {
		e := Entry{Domain: d}
		if len(entries)%2 == 1 {
			e.Ports = []uint16{8443}
		}
		if len(entries)%3 == 2 {
			e.Credential = "cred"
		}
		p, err := Compile([]Entry{e}, Options{})
		if err != nil || seen[p.Rules()[0].Pattern] {
			continue
		}
		seen[p.Rules()[0].Pattern] = true
		entries = append(entries, e)
	}
	p, err := Compile(entries, Options{})
	if err != nil {
		t.Fatalf("Compile of individually valid entries: %v", err)
	}
	return p
}

// referenceDecide is the obvious, slow implementation of the matching rules:
// rank every rule (exact beats any wildcard, a longer wildcard suffix beats a
// shorter one, "*" is last) and keep the best.
func referenceDecide(rules []*Rule, t Target) (Reason, *Rule) {
	var best *Rule
	bestRank := -1
	for _, r := range rules {
		if rank := referenceRank(r.Pattern, t); rank > bestRank {
			best, bestRank = r, rank
		}
	}
	switch {
	case best == nil:
		return ReasonNotAllowlisted, nil
	case !best.AllowsPort(t.Port):
		return ReasonPortNotAllowed, best
	}
	return ReasonNone, best
}

func referenceRank(pattern string, t Target) int {
	switch {
	case pattern == "*":
		return 0
	case pattern == t.Host:
		return math.MaxInt
	case strings.HasPrefix(pattern, "*.") && strings.HasSuffix(t.Host, pattern[1:]):
		return len(pattern)
	}
	return -1
}

func ruleName(r *Rule) string {
	if r == nil {
		return ""
	}
	return r.Pattern
}
