package netguard

import (
	"net/netip"
	"strings"
	"testing"
)

// classCases covers every class, the first and last address of every prefix
// with its public neighbours, and every IPv6 form that carries IPv4.
var classCases = []struct {
	ip   string
	want Class
}{
	// loopback, RFC 1122 and RFC 4291
	{"127.0.0.0", Loopback}, {"127.0.0.1", Loopback}, {"127.255.255.255", Loopback},
	{"126.255.255.255", Public}, {"128.0.0.0", Public}, {"::1", Loopback},
	// unspecified
	{"0.0.0.0", Unspecified}, {"0.255.255.255", Unspecified}, {"1.0.0.0", Public}, {"::", Unspecified},
	// link-local, with the metadata addresses inside it
	{"169.254.0.0", LinkLocal}, {"169.254.255.255", LinkLocal}, {"169.253.255.255", Public}, {"169.255.0.0", Public},
	{"169.254.169.253", LinkLocal}, {"169.254.169.254", Metadata}, {"169.254.169.255", LinkLocal},
	{"169.254.170.2", Metadata}, {"169.254.170.3", LinkLocal},
	{"fe80::", LinkLocal}, {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", LinkLocal}, {"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public},
	// metadata
	{"100.100.100.200", Metadata}, {"100.100.100.201", CGNAT},
	{"fd00:ec2::254", Metadata}, {"fd00:ec2::253", Private}, {"fd20:ce::254", Metadata}, {"fd20:ce::255", Private},
	// private
	{"10.0.0.0", Private}, {"10.255.255.255", Private}, {"9.255.255.255", Public}, {"11.0.0.0", Public},
	{"172.16.0.0", Private}, {"172.31.255.255", Private}, {"172.15.255.255", Public}, {"172.32.0.0", Public},
	{"192.168.0.0", Private}, {"192.168.255.255", Private}, {"192.167.255.255", Public}, {"192.169.0.0", Public},
	{"fc00::", Private}, {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Private}, {"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public}, {"fe00::", Public},
	// cgnat
	{"100.64.0.0", CGNAT}, {"100.127.255.255", CGNAT}, {"100.63.255.255", Public}, {"100.128.0.0", Public},
	// multicast
	{"224.0.0.0", Multicast}, {"239.255.255.255", Multicast}, {"223.255.255.255", Public},
	{"ff00::", Multicast}, {"ff02::1", Multicast}, {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Multicast},
	// broadcast, and the rest of 240.0.0.0/4
	{"255.255.255.255", Broadcast}, {"255.255.255.254", Reserved}, {"240.0.0.0", Reserved},
	// reserved
	{"192.0.0.0", Reserved}, {"192.0.0.255", Reserved}, {"192.0.1.0", Public}, {"191.255.255.255", Public},
	{"192.0.2.0", Reserved}, {"192.0.2.255", Reserved}, {"192.0.3.0", Public},
	{"198.18.0.0", Reserved}, {"198.19.255.255", Reserved}, {"198.17.255.255", Public}, {"198.20.0.0", Public},
	{"198.51.100.0", Reserved}, {"198.51.100.255", Reserved}, {"198.51.99.255", Public}, {"198.51.101.0", Public},
	{"203.0.113.0", Reserved}, {"203.0.113.255", Reserved}, {"203.0.112.255", Public}, {"203.0.114.0", Public},
	{"100::", Reserved}, {"100::ffff:ffff:ffff:ffff", Reserved}, {"100:0:0:1::", Public},
	{"2001:db8::", Reserved}, {"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", Reserved}, {"2001:db9::", Public},
	// public
	{"8.8.8.8", Public}, {"1.1.1.1", Public}, {"2606:4700::1111", Public}, {"2a00:1450:4001::1", Public},
	// zones are ignored
	{"fe80::1%eth0", LinkLocal}, {"fd00:ec2::254%eth0", Metadata}, {"2606:4700::1111%eth0", Public},
	// IPv4-mapped, RFC 4291 §2.5.5.2
	{"::ffff:127.0.0.1", Loopback}, {"::ffff:10.0.0.1", Private}, {"::ffff:169.254.169.254", Metadata},
	{"::ffff:255.255.255.255", Broadcast}, {"::ffff:0.0.0.0", Unspecified}, {"::ffff:8.8.8.8", Public},
	{"::ffff:127.0.0.1%eth0", Loopback},
	// IPv4-compatible, RFC 4291 §2.5.5.1: judged by the IPv4 address, never below reserved
	{"::127.0.0.1", Loopback}, {"::10.0.0.1", Private}, {"::169.254.169.254", Metadata},
	{"::0.0.0.2", Unspecified}, {"::8.8.8.8", Reserved}, {"::255.255.255.255", Broadcast},
	// IPv4-translated (SIIT), RFC 2765 §2.1
	{"::ffff:0:10.0.0.1", Private}, {"::ffff:0:127.0.0.1", Loopback}, {"::ffff:0:8.8.8.8", Public},
	// NAT64 well-known prefix, RFC 6052
	{"64:ff9b::127.0.0.1", Loopback}, {"64:ff9b::10.0.0.1", Private}, {"64:ff9b::169.254.169.254", Metadata},
	{"64:ff9b::100.64.0.1", CGNAT}, {"64:ff9b::8.8.8.8", Public},
	// NAT64 local-use prefix, RFC 8215: the /96 layout, then the /48 layout (10.1.1.0, 127.1.1.0)
	{"64:ff9b:1::10.0.0.1", Private}, {"64:ff9b:1::127.0.0.1", Loopback}, {"64:ff9b:1::8.8.8.8", Public},
	{"64:ff9b:1:a01:1:0:808:808", Private}, {"64:ff9b:1:7f01:1:0:808:808", Loopback},
	// 6to4, RFC 3056: bits 16-47
	{"2002:a00:1::", Private}, {"2002:7f00:1::1", Loopback}, {"2002:a9fe:a9fe::", Metadata},
	{"2002:6440:1::", CGNAT}, {"2002:808:808::1", Public},
	// Teredo, RFC 4380: server in bits 32-63, client is the last 32 bits XOR 0xffffffff
	{"2001:0:4136:e378:8000:63bf:3fff:fdd2", Reserved}, // RFC 4380 §4 example: client 192.0.2.45
	{"2001:0:a00:1::f7f7:fbfb", Private},               // server 10.0.0.1, client 8.8.4.4
	{"2001:0:808:808::f5ff:fffe", Private},             // server 8.8.8.8, client 10.0.0.1
	{"2001:0:808:808::80ff:fffe", Loopback},            // client 127.0.0.1
	{"2001:0:a00:1::80ff:fffe", Loopback},              // private server, loopback client: loopback wins
	{"2001:0:808:808::f7f7:fbfb", Public},              // server 8.8.8.8, client 8.8.4.4
	{"2001:0:808:808::", Broadcast},                    // client 255.255.255.255
}

func TestClassify(t *testing.T) {
	for _, c := range classCases {
		if got := Classify(netip.MustParseAddr(c.ip)); got != c.want {
			t.Errorf("Classify(%s) = %q, want %q", c.ip, got, c.want)
		}
	}
}

func TestClassifyInvalidFailsClosed(t *testing.T) {
	if got := Classify(netip.Addr{}); got != Unspecified {
		t.Errorf("Classify(invalid) = %q, want %q", got, Unspecified)
	}
}

func TestAlwaysDenied(t *testing.T) {
	for c, want := range map[Class]bool{
		Loopback: true, Unspecified: true, LinkLocal: true, Metadata: true, Multicast: true, Broadcast: true, Self: true,
		Private: false, CGNAT: false, Reserved: false, Public: false,
	} {
		if got := c.AlwaysDenied(); got != want {
			t.Errorf("%q.AlwaysDenied() = %v, want %v", c, got, want)
		}
	}
}

// TestTableCited checks that every prefix is masked and carries its source.
// classCases covers the ends of every prefix.
func TestTableCited(t *testing.T) {
	for _, row := range table {
		if row.prefix != row.prefix.Masked() || !cited(row.cite) {
			t.Errorf("table row %s: unmasked or uncited (%q)", row.prefix, row.cite)
		}
	}
	for _, e := range embedders {
		if e.prefix != e.prefix.Masked() || !strings.HasPrefix(e.cite, "RFC ") {
			t.Errorf("embedder %s: unmasked or uncited (%q)", e.prefix, e.cite)
		}
	}
}

// cited reports whether s names its source: an RFC, or a vendor's docs.
func cited(s string) bool {
	return strings.HasPrefix(s, "RFC ") || strings.Contains(s, " docs: ")
}

// FuzzClassify checks that Classify never panics, that an IPv4-mapped
// address is classified as its IPv4 address, and that the default guard
// blocks exactly the addresses that are not Public.
func FuzzClassify(f *testing.F) {
	g, err := New(Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{8, 8, 8, 8})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a16 [16]byte
		copy(a16[:], b)
		ip6 := netip.AddrFrom16(a16)
		v4 := netip.AddrFrom4([4]byte(a16[:4]))
		if got, want := Classify(netip.AddrFrom16(v4.As16())), Classify(v4); got != want {
			t.Errorf("Classify(::ffff:%s) = %q, Classify(%s) = %q", v4, got, v4, want)
		}
		for _, ip := range []netip.Addr{ip6, v4, ip6.WithZone("z")} {
			c := Classify(ip)
			if blocked := g.Check(netip.AddrPortFrom(ip, 443)) != nil; blocked != (c != Public) {
				t.Errorf("Check(%s) blocked=%v, Classify = %q", ip, blocked, c)
			}
		}
	})
}

func BenchmarkClassify(b *testing.B) {
	ips := make([]netip.Addr, len(classCases))
	for i, c := range classCases {
		ips[i] = netip.MustParseAddr(c.ip)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Classify(ips[i%len(ips)])
	}
}
