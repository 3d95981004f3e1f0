package proxy

import (
	"net/netip"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// BenchmarkRedecide10k is what a reload adds for 10,000 open tunnels, every one
// still allowed: deciding each again on the new Snapshot (the policy, the address
// guard) under a copy of the registry. Also reported: registering and removing one.
func BenchmarkRedecide10k(b *testing.B) {
	pol, err := allowlist.Compile([]allowlist.Entry{{Domain: "*.allowed.test"}, {Domain: "allowed.test"}}, allowlist.Options{})
	if err != nil {
		b.Fatal(err)
	}
	guard, err := netguard.New(netguard.Options{})
	if err != nil {
		b.Fatal(err)
	}
	snap := &Snapshot{Policy: pol, Guard: guard}
	s := &Server{}
	target := allowlist.Target{Host: "api.allowed.test", Port: 443}
	for range 10_000 {
		s.live.add(&openConn{target: target, upstream: netip.MustParseAddrPort("93.184.216.34:443"), close: func() {}})
	}
	b.Run("swap", func(b *testing.B) {
		for b.Loop() {
			if _, ended := s.redecide(snap); ended != 0 {
				b.Fatalf("%d ended", ended)
			}
		}
	})
	b.Run("register", func(b *testing.B) {
		o := &openConn{target: target, close: func() {}}
		for b.Loop() {
			s.live.add(o)
			s.live.remove(o)
		}
	})
}
