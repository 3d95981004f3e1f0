package inject

import (
	"net/http"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/scrub"
)

// BenchmarkApply is the per-request injection of an intercepted request: a
// credential and a transform header into a typical client head that carries its
// own copy of one of them.
func BenchmarkApply(b *testing.B) {
	in, r := rule(b, allowlist.Entry{Domain: "api.example.com", Credential: "api",
		Transform: []allowlist.Header{{Name: "X-Key", Value: "k"}}})
	base := http.Header{
		"User-Agent":    {"agent/1.0"},
		"Accept":        {"*/*"},
		"Authorization": {"Bearer client"},
		"X-Request-Id":  {"abc"},
	}
	b.ReportAllocs()
	for b.Loop() {
		h := make(http.Header, len(base)+1)
		for k, v := range base {
			h[k] = v
		}
		if _, err := in.Apply(r, h, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCompileScrub is what Apply would pay per request without its cached
// scrub.Set: compiling one credential's and one transform's values.
func BenchmarkCompileScrub(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		scrub.Compile("Bearer tok-3f9a1c-0123456789abcdef", "transform-value-0123")
	}
}
