package netguard

import (
	"net/netip"
	"testing"
)

// A live listener address is Self while it is held, on its exact address, on
// any loopback address when bound to a wildcard, from the unspecified address;
// and no longer once its last holder removes it.
func TestLiveSelf(t *testing.T) {
	var set SelfSet
	g, err := New(Options{UnsafeAllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Live: &set})
	if err != nil {
		t.Fatal(err)
	}
	exact, wild := netip.MustParseAddrPort("127.77.0.1:4000"), netip.MustParseAddrPort("0.0.0.0:5000")
	set.Add(exact)
	set.Add(exact) // a replacement sandbox serving the same socket
	set.Add(wild)
	for _, c := range []struct {
		addr string
		self bool
	}{
		{"127.77.0.1:4000", true}, {"[::ffff:127.77.0.1]:4000", true}, {"127.77.0.2:4000", false},
		{"127.0.0.1:5000", true}, {"127.9.9.9:5000", true}, {"0.0.0.0:4000", true}, {"127.0.0.1:6000", false},
	} {
		err := g.Check(netip.MustParseAddrPort(c.addr))
		be, _ := err.(*BlockedError)
		if got := be != nil && be.Class == Self; got != c.self {
			t.Errorf("%s: %v, want self %v", c.addr, err, c.self)
		}
	}
	set.Remove(exact)
	if g.Check(exact) == nil {
		t.Error("removed by one of its two holders, it is no longer Self")
	}
	set.Remove(exact)
	if err := g.Check(exact); err != nil {
		t.Errorf("with no holder left: %v, want it dialable", err)
	}
}
