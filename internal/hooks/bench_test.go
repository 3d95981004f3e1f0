package hooks

import (
	"testing"

	"github.com/egressd/egressd/pkg/hookauth"
)

// BenchmarkSignCall is the work a signed hook call adds to an intercepted POST:
// the claims (with the SHA-256 of a 512-byte body) and one Ed25519 signature.
func BenchmarkSignCall(b *testing.B) {
	s, err := NewSigner(newKey(b))
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 512)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.SignCall(testMatch, "env_demo", hookauth.IdentListener, body); err != nil {
			b.Fatal(err)
		}
	}
}
