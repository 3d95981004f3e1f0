package allowlist

import (
	"fmt"
	"testing"
)

// benchPolicy compiles n entries, a third each exact, wildcard and exact
// with a credential, plus "*"-free misses, and returns targets that hit
// exact names, wildcards at depth, and nothing.
func benchPolicy(tb testing.TB, n int) (*Policy, []Target) {
	tb.Helper()
	entries := make([]Entry, 0, n)
	for i := range n {
		e := Entry{Domain: fmt.Sprintf("host%d.example%d.com", i, i%97)}
		switch i % 3 {
		case 1:
			e.Domain = fmt.Sprintf("*.svc%d.example%d.com", i, i%97)
		case 2:
			e.Credential = fmt.Sprintf("cred-%d", i)
		}
		entries = append(entries, e)
	}
	p := mustCompile(tb, entries, Options{})
	var targets []Target
	for i := 0; i < n; i += 7 {
		targets = append(targets,
			Target{Host: fmt.Sprintf("host%d.example%d.com", i, i%97), Port: 443},
			Target{Host: fmt.Sprintf("a.b.c.svc%d.example%d.com", i, i%97), Port: 443},
			Target{Host: fmt.Sprintf("deep.miss.nothing%d.example.org", i), Port: 443},
			Target{Host: fmt.Sprintf("host%d.example%d.com", i, i%97), Port: 8080},
		)
	}
	return p, targets
}

func BenchmarkDecide(b *testing.B) {
	p, targets := benchPolicy(b, 10_000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_ = p.Decide(targets[i%len(targets)])
		i++
	}
}

func BenchmarkNormalizeHost(b *testing.B) {
	for _, host := range []string{"api.github.com", "API.GitHub.com.", "bücher.example", "0x7f.1", "[2001:db8::1]"} {
		b.Run(host, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = NormalizeHost(host)
			}
		})
	}
}

func BenchmarkParseAuthority(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_, _ = ParseAuthority("api.github.com:443", 443)
	}
}
