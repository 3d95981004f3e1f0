package netguard

import (
	"net/netip"
	"testing"
)

// prefixCase is one row of table: its first, last and one inside address,
// each with the class it must get. An empty override means want.
type prefixCase struct {
	prefix              string
	want                Class
	inside              string
	firstWant, lastWant Class // where an edge address has another class
	insideWant          Class
}

// prefixCases holds one case per table row; TestTableCasesComplete makes
// sure no row goes without one.
var prefixCases = []prefixCase{
	{prefix: "169.254.169.254/32", want: Metadata, inside: "169.254.169.254"},
	{prefix: "169.254.170.2/32", want: Metadata, inside: "169.254.170.2"},
	{prefix: "169.254.170.23/32", want: Metadata, inside: "169.254.170.23"},
	{prefix: "169.254.0.23/32", want: Metadata, inside: "169.254.0.23"},
	{prefix: "100.100.100.200/32", want: Metadata, inside: "100.100.100.200"},
	{prefix: "168.63.129.16/32", want: Metadata, inside: "168.63.129.16"},
	{prefix: "192.0.0.192/32", want: Metadata, inside: "192.0.0.192"},
	{prefix: "fd00:ec2::254/128", want: Metadata, inside: "fd00:ec2::254"},
	{prefix: "fd00:ec2::23/128", want: Metadata, inside: "fd00:ec2::23"},
	{prefix: "fd20:ce::254/128", want: Metadata, inside: "fd20:ce::254"},
	{prefix: "fd00:c1::a9fe:a9fe/128", want: Metadata, inside: "fd00:c1::a9fe:a9fe"},

	{prefix: "0.0.0.0/8", want: Unspecified, inside: "0.1.2.3"},
	{prefix: "127.0.0.0/8", want: Loopback, inside: "127.0.0.1"},
	{prefix: "169.254.0.0/16", want: LinkLocal, inside: "169.254.1.1"},
	{prefix: "10.0.0.0/8", want: Private, inside: "10.1.2.3"},
	{prefix: "172.16.0.0/12", want: Private, inside: "172.20.1.1"},
	{prefix: "192.168.0.0/16", want: Private, inside: "192.168.1.1"},
	{prefix: "100.64.0.0/10", want: CGNAT, inside: "100.64.1.1"},
	{prefix: "224.0.0.0/4", want: Multicast, inside: "239.1.2.3"},
	{prefix: "255.255.255.255/32", want: Broadcast, inside: "255.255.255.255"},
	{prefix: "192.0.0.0/24", want: Reserved, inside: "192.0.0.8"},
	{prefix: "192.0.2.0/24", want: Reserved, inside: "192.0.2.45"},
	{prefix: "192.88.99.0/24", want: Reserved, inside: "192.88.99.1"},
	{prefix: "198.18.0.0/15", want: Reserved, inside: "198.19.1.1"},
	{prefix: "198.51.100.0/24", want: Reserved, inside: "198.51.100.7"},
	{prefix: "203.0.113.0/24", want: Reserved, inside: "203.0.113.9"},
	{prefix: "240.0.0.0/4", want: Reserved, inside: "250.1.2.3", lastWant: Broadcast},

	{prefix: "::/128", want: Unspecified, inside: "::"},
	{prefix: "::1/128", want: Loopback, inside: "::1"},
	{prefix: "fe80::/10", want: LinkLocal, inside: "fe80::1"},
	{prefix: "fc00::/7", want: Private, inside: "fd12:3456::1"},
	{prefix: "fec0::/10", want: Private, inside: "fec0::1"},
	{prefix: "ff00::/8", want: Multicast, inside: "ff02::1"},
	{prefix: "100::/64", want: Reserved, inside: "100::1"},
	{prefix: "2001:2::/48", want: Reserved, inside: "2001:2::1"},
	{prefix: "2001:10::/28", want: Reserved, inside: "2001:10::1"},
	{prefix: "2001:db8::/32", want: Reserved, inside: "2001:db8::1"},
	{prefix: "3fff::/20", want: Reserved, inside: "3fff::1"},
	{prefix: "5f00::/16", want: Reserved, inside: "5f00::1"},
	// ::/96 is judged by the IPv4 address it carries, never below reserved.
	{prefix: "::/96", want: Reserved, inside: "::8.8.8.8", firstWant: Unspecified, lastWant: Broadcast},
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func or(c, def Class) Class {
	if c == "" {
		return def
	}
	return c
}

// embeddings returns the IPv6 forms that carry v4, each
// judged by v4: IPv4-mapped, IPv4-compatible, NAT64 (64:ff9b::/96), 6to4,
// and Teredo with v4 as the server and as the (obfuscated) client. The other
// IPv4 address a Teredo form carries is the public 8.8.4.4.
func embeddings(v4 netip.Addr) map[string]netip.Addr {
	a := v4.As4()
	form := func(prefix [16]byte, at int, v [4]byte) netip.Addr {
		copy(prefix[at:], v[:])
		return netip.AddrFrom16(prefix)
	}
	public := [4]byte{8, 8, 4, 4}
	xor := func(v [4]byte) [4]byte {
		for i := range v {
			v[i] ^= 0xff
		}
		return v
	}
	teredoServer := form([16]byte{0x20, 0x01}, 4, a)
	tsb := teredoServer.As16()
	teredoServer = form(tsb, 12, xor(public))
	teredoClient := form(form([16]byte{0x20, 0x01}, 4, public).As16(), 12, xor(a))
	return map[string]netip.Addr{
		"mapped":        netip.AddrFrom16(v4.As16()),
		"compatible":    form([16]byte{}, 12, a),
		"nat64":         form([16]byte{0x00, 0x64, 0xff, 0x9b}, 12, a),
		"6to4":          form([16]byte{0x20, 0x02}, 2, a),
		"teredo server": teredoServer,
		"teredo client": teredoClient,
	}
}

// TestTablePrefixes checks the first, last and one inside address of every
// row of table, and for IPv4 rows every IPv6 form that carries each of them.
// Classify only reads the table: nothing is dialled.
func TestTablePrefixes(t *testing.T) {
	for _, c := range prefixCases {
		p := netip.MustParsePrefix(c.prefix)
		for _, a := range []struct {
			ip   netip.Addr
			want Class
		}{
			{p.Addr(), or(c.firstWant, c.want)},
			{lastAddr(p), or(c.lastWant, c.want)},
			{netip.MustParseAddr(c.inside), or(c.insideWant, c.want)},
		} {
			if !p.Contains(a.ip) {
				t.Fatalf("%s: case address %s is outside the prefix", c.prefix, a.ip)
			}
			if got := Classify(a.ip); got != a.want {
				t.Errorf("%s: Classify(%s) = %q, want %q", c.prefix, a.ip, got, a.want)
			}
			if !a.ip.Is4() {
				continue
			}
			for name, e := range embeddings(a.ip) {
				if got := Classify(e); got != a.want {
					t.Errorf("%s: Classify(%s, %s of %s) = %q, want %q", c.prefix, e, name, a.ip, got, a.want)
				}
			}
		}
	}
}

// TestTableCasesComplete makes sure every row of table has a case in
// prefixCases, with the same class, so no prefix goes untested.
func TestTableCasesComplete(t *testing.T) {
	cases := map[netip.Prefix]Class{}
	for _, c := range prefixCases {
		cases[netip.MustParsePrefix(c.prefix)] = c.want
	}
	for _, row := range table {
		if want, ok := cases[row.prefix]; !ok || want != row.class {
			t.Errorf("table row %s (%s) has no matching case in prefixCases", row.prefix, row.class)
		}
	}
	if len(cases) != len(table) {
		t.Errorf("prefixCases has %d prefixes, table %d rows", len(cases), len(table))
	}
}

// TestNeighbours checks that the addresses just outside the prefixes this
// review added stay public, so the new rows are no wider than cited.
func TestNeighbours(t *testing.T) {
	for _, s := range []string{
		"168.63.129.15", "168.63.129.17", "192.88.98.255", "192.88.100.0",
		"2001:1::1", "2001:3::1", "2001:20::1", "2001:1:ffff:ffff:ffff:ffff:ffff:ffff", "2001:3::",
		"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff:1000::", "5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "5f01::",
		"192.31.196.1", "192.52.193.1", "192.175.48.1", "2620:4f:8000::1",
	} {
		if got := Classify(netip.MustParseAddr(s)); got != Public {
			t.Errorf("Classify(%s) = %q, want public", s, got)
		}
	}
	for s, want := range map[string]Class{
		"169.254.0.22": LinkLocal, "169.254.0.24": LinkLocal, "169.254.170.22": LinkLocal, "169.254.170.24": LinkLocal, "192.0.0.191": Reserved, "192.0.0.193": Reserved,
		"fd00:ec2::22": Private, "fd00:ec2::24": Private, "fd00:c1::a9fe:a9ff": Private,
		"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff": LinkLocal, "fec0::": Private, "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": Private,
	} {
		if got := Classify(netip.MustParseAddr(s)); got != want {
			t.Errorf("Classify(%s) = %q, want %q", s, got, want)
		}
	}
}
