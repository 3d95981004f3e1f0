package inject

import (
	"net/http"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
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
