package netguard

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

func addrPorts(ss ...string) []netip.AddrPort {
	aps := make([]netip.AddrPort, len(ss))
	for i, s := range ss {
		aps[i] = netip.MustParseAddrPort(s)
	}
	return aps
}

func mustGuard(t testing.TB, o Options) *Guard {
	t.Helper()
	g, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	return g
}

// checkCase is one address and the class it is blocked as (Public: allowed).
type checkCase struct {
	addr string
	want Class
}

func assertChecks(t *testing.T, g *Guard, cases []checkCase) {
	t.Helper()
	for _, c := range cases {
		err := g.Check(netip.MustParseAddrPort(c.addr))
		var blocked *BlockedError
		switch {
		case c.want == Public && err != nil:
			t.Errorf("Check(%s) = %v, want allowed", c.addr, err)
		case c.want != Public && (!errors.As(err, &blocked) || blocked.Class != c.want):
			t.Errorf("Check(%s) = %v, want blocked as %q", c.addr, err, c.want)
		}
	}
}

func TestCheckDefault(t *testing.T) {
	assertChecks(t, mustGuard(t, Options{}), []checkCase{
		{"8.8.8.8:443", Public}, {"[2606:4700::1111]:443", Public},
		{"10.0.0.1:443", Private}, {"100.64.0.1:443", CGNAT}, {"192.0.2.1:443", Reserved},
		{"127.0.0.1:80", Loopback}, {"[::ffff:127.0.0.1]:80", Loopback}, {"[::1]:80", Loopback},
		{"169.254.169.254:80", Metadata}, {"[fd00:ec2::254]:80", Metadata}, {"[fe80::1%eth0]:80", LinkLocal},
		{"0.0.0.0:80", Unspecified}, {"[::]:80", Unspecified}, {"224.0.0.1:80", Multicast}, {"255.255.255.255:80", Broadcast},
		{"[64:ff9b::a00:1]:80", Private}, {"[2002:7f00:1::]:80", Loopback},
	})
}

func TestCheckAllowCIDRs(t *testing.T) {
	t.Run("10/8 opens private 10/8 only", func(t *testing.T) {
		assertChecks(t, mustGuard(t, Options{AllowCIDRs: prefixes("10.0.0.0/8")}), []checkCase{
			{"10.0.0.1:443", Public}, {"10.255.255.255:443", Public}, {"[::ffff:10.1.2.3]:443", Public},
			{"[64:ff9b::10.1.2.3]:443", Public}, {"[2002:a00:1::]:443", Public},
			{"172.16.0.1:443", Private}, {"192.168.1.1:443", Private}, {"100.64.0.1:443", CGNAT},
		})
	})
	t.Run("a CIDR over always-denied classes does not open them", func(t *testing.T) {
		g := mustGuard(t, Options{AllowCIDRs: prefixes("0.0.0.0/0", "::/0")})
		assertChecks(t, g, []checkCase{
			{"10.0.0.1:443", Public}, {"100.64.0.1:443", Public}, {"192.0.2.1:443", Public}, {"[fd00::1]:443", Public},
			{"[2001:db8::1]:443", Public}, {"[::8.8.8.8]:443", Public},
			{"127.0.0.1:443", Loopback}, {"[::1]:443", Loopback}, {"[64:ff9b::127.0.0.1]:443", Loopback},
			{"169.254.169.254:80", Metadata}, {"100.100.100.200:80", Metadata}, {"[fd00:ec2::254]:80", Metadata},
			{"[fd20:ce::254]:80", Metadata}, {"[::ffff:169.254.169.254]:80", Metadata},
			{"169.254.1.1:80", LinkLocal}, {"[fe80::1]:80", LinkLocal}, {"0.0.0.0:80", Unspecified},
			{"224.0.0.1:80", Multicast}, {"[ff02::1]:80", Multicast}, {"255.255.255.255:80", Broadcast},
		})
		if g.Unsafe() {
			t.Error("Unsafe() = true without UnsafeAllowCIDRs")
		}
	})
	t.Run("an IPv4-mapped CIDR works as its IPv4 form", func(t *testing.T) {
		assertChecks(t, mustGuard(t, Options{AllowCIDRs: prefixes("::ffff:10.0.0.0/104")}), []checkCase{
			{"10.1.2.3:443", Public}, {"11.0.0.1:443", Public}, {"172.16.0.1:443", Private},
		})
	})
	t.Run("Teredo needs every internal address it carries opened", func(t *testing.T) {
		// server 10.0.0.1, client 192.168.0.1 (0x3f57fffe = ^c0a80001)
		assertChecks(t, mustGuard(t, Options{AllowCIDRs: prefixes("10.0.0.0/8")}), []checkCase{
			{"[2001:0:a00:1::f7f7:fbfb]:443", Public}, {"[2001:0:a00:1::3f57:fffe]:443", Private},
		})
	})
}

func TestCheckUnsafeAllowCIDRs(t *testing.T) {
	g := mustGuard(t, Options{
		UnsafeAllowCIDRs: prefixes("127.0.0.0/8", "169.254.0.0/16", "::1/128"),
		Self:             addrPorts("127.0.0.1:15001", "127.0.0.1:15000"),
	})
	if !g.Unsafe() {
		t.Error("Unsafe() = false with UnsafeAllowCIDRs")
	}
	assertChecks(t, g, []checkCase{
		{"127.0.0.1:8080", Public}, {"127.0.0.2:15001", Public}, {"[::ffff:127.0.0.1]:8080", Public}, {"[::1]:8080", Public},
		{"169.254.1.1:80", Public},
		{"127.0.0.1:15001", Self}, {"127.0.0.1:15000", Self}, {"[::ffff:127.0.0.1]:15001", Self},
		{"[::127.0.0.1]:15001", Self}, {"[64:ff9b::127.0.0.1]:15001", Self}, {"0.0.0.0:15001", Self},
		{"169.254.169.254:80", Metadata}, {"169.254.170.2:80", Metadata},
		{"10.0.0.1:443", Private}, {"[fe80::1]:80", LinkLocal},
	})
}

func TestCheckSelfWildcard(t *testing.T) {
	g := mustGuard(t, Options{
		UnsafeAllowCIDRs: prefixes("0.0.0.0/0", "::/0"),
		Self:             addrPorts("0.0.0.0:15001", "[::]:15000"),
	})
	cases := []checkCase{
		{"127.0.0.1:15001", Self}, {"127.9.9.9:15001", Self}, {"[::1]:15001", Self}, {"0.0.0.0:15001", Self},
		{"[::ffff:127.0.0.1]:15001", Self}, {"127.0.0.1:15000", Self}, {"[::1]:15000", Self},
		{"127.0.0.1:15002", Public}, {"10.0.0.1:15002", Public}, {"8.8.8.8:15001", Public},
	}
	for _, a := range localAddrs(t) {
		cases = append(cases, checkCase{netip.AddrPortFrom(a, 15001).String(), Self})
	}
	assertChecks(t, g, cases)
}

func TestCheckSelfExact(t *testing.T) {
	assertChecks(t, mustGuard(t, Options{
		AllowCIDRs: prefixes("10.0.0.0/8"),
		Self:       addrPorts("10.1.2.3:15001"),
	}), []checkCase{
		{"10.1.2.3:15001", Self}, {"[::ffff:10.1.2.3]:15001", Self}, {"10.1.2.3:15002", Public},
		{"10.1.2.4:15001", Public},
	})
}

func localAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Zone() == "" {
			out = append(out, p.Addr())
		}
	}
	return out
}

func TestNewRejects(t *testing.T) {
	for name, c := range map[string]struct {
		o    Options
		want []string
	}{
		"loopback in allow_cidrs": {Options{AllowCIDRs: prefixes("127.0.0.0/8")},
			[]string{"network.allow_cidrs: 127.0.0.0/8 is loopback", "use unsafe_allow_cidrs"}},
		"metadata in allow_cidrs": {Options{AllowCIDRs: prefixes("169.254.169.254/32")},
			[]string{"169.254.169.254/32 is metadata", "remove it"}},
		"link-local in allow_cidrs": {Options{AllowCIDRs: prefixes("169.254.0.0/16")},
			[]string{"169.254.0.0/16 is link_local"}},
		"metadata in unsafe_allow_cidrs": {Options{UnsafeAllowCIDRs: prefixes("fd00:ec2::254/128")},
			[]string{"network.unsafe_allow_cidrs: fd00:ec2::254/128 is metadata"}},
		"invalid prefix": {Options{AllowCIDRs: []netip.Prefix{{}}}, []string{"not a valid CIDR"}},
		"invalid self":   {Options{Self: []netip.AddrPort{{}}}, []string{"not a valid ip:port"}},
		"every problem at once": {Options{AllowCIDRs: prefixes("127.0.0.1/32", "10.0.0.0/8", "::1/128")},
			[]string{"127.0.0.1/32 is loopback", "::1/128 is loopback"}},
	} {
		_, err := New(c.o)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: New = %v, want an error containing %q", name, err, w)
			}
		}
	}
}

func TestNewAcceptsWideCIDRs(t *testing.T) {
	mustGuard(t, Options{
		AllowCIDRs:       prefixes("0.0.0.0/0", "::/0", "10.0.0.0/8", "fc00::/7", "100.64.0.0/10", "10.1.2.3/8"),
		UnsafeAllowCIDRs: prefixes("127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/0"),
	})
}

func TestBlockedErrorMessage(t *testing.T) {
	for _, c := range []struct {
		err  BlockedError
		want string
	}{
		{BlockedError{netip.MustParseAddrPort("10.0.0.1:443"), Private}, "10.0.0.1:443 is a blocked address (private)"},
		{BlockedError{netip.MustParseAddrPort("[fd00:ec2::254]:80"), Metadata}, "[fd00:ec2::254]:80 is a blocked address (metadata)"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
}

func TestCheckDoesNotAllocate(t *testing.T) {
	g := benchGuard(t)
	for _, s := range []string{"8.8.8.8:443", "[2606:4700::1111]:443", "10.1.2.3:443", "[2001:0:808:808::f7f7:fbfb]:443"} {
		ap := netip.MustParseAddrPort(s)
		if n := testing.AllocsPerRun(100, func() { _ = g.Check(ap) }); n != 0 {
			t.Errorf("Check(%s): %v allocations, want 0", s, n)
		}
	}
}

func benchGuard(t testing.TB) *Guard {
	return mustGuard(t, Options{
		AllowCIDRs: prefixes("10.0.0.0/8", "fd00::/8"),
		Self:       addrPorts("127.0.0.1:15001", "127.0.0.1:15000"),
	})
}

func BenchmarkCheck(b *testing.B) {
	g := benchGuard(b)
	aps := addrPorts("8.8.8.8:443", "[2606:4700::1111]:443", "10.1.2.3:443", "140.82.112.3:443")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if g.Check(aps[i%len(aps)]) != nil {
			b.Fatal("blocked")
		}
	}
}
