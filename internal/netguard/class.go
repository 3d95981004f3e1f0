// Package netguard classifies IP addresses, resolves names and guards every
// outbound dial; the guard is always on.
//
// The flow is the one smokescreen and daenney/ssrf use: the caller decides on
// the name, Guard.Resolve looks it up and checks every answer, the Dialer
// dials only the checked literal addresses, and its net.Dialer.Control hook
// checks each address again just before connect, which closes DNS rebinding
// and catches any path that skipped Resolve.
package netguard

import "net/netip"

// Class is the address class of an IP address. Its value is the stable code
// used as the `detail` of an internal_address denial.
type Class string

// The address classes of DESIGN.md "Decisions and errors".
const (
	Public      Class = "" // not blocked by class
	Loopback    Class = "loopback"
	Unspecified Class = "unspecified"
	LinkLocal   Class = "link_local"
	Metadata    Class = "metadata"
	Private     Class = "private"
	CGNAT       Class = "cgnat"
	Multicast   Class = "multicast"
	Broadcast   Class = "broadcast"
	Reserved    Class = "reserved"
	Self        Class = "self" // egressd's own listeners; only Guard.Check returns it
)

// AlwaysDenied reports whether no AllowCIDRs entry can open c. Private, CGNAT
// and Reserved are denied unless AllowCIDRs opens them; Public is not denied.
func (c Class) AlwaysDenied() bool {
	switch c {
	case Loopback, Unspecified, LinkLocal, Metadata, Multicast, Broadcast, Self:
		return true
	}
	return false
}

// rank orders classes by restrictiveness: always denied, then openable, then
// public. Where an address carries several IPv4 addresses the highest wins.
func (c Class) rank() int {
	switch {
	case c == Public:
		return 0
	case c.AlwaysDenied():
		return 2
	}
	return 1
}

// prefixClass is one row of the denied-prefix table.
type prefixClass struct {
	prefix netip.Prefix
	class  Class
	cite   string
}

// table lists every classified prefix with its source. The first matching row
// wins, so the metadata addresses come before the link-local, CGNAT and ULA
// ranges that contain them, and broadcast before 240.0.0.0/4.
var table = []prefixClass{
	{pfx("169.254.169.254/32"), Metadata, "AWS, GCP, Azure, OpenStack instance metadata"},
	{pfx("169.254.170.2/32"), Metadata, "AWS ECS task metadata and credentials"},
	{pfx("100.100.100.200/32"), Metadata, "Alibaba Cloud ECS metadata"},
	{pfx("fd00:ec2::254/128"), Metadata, "AWS instance metadata over IPv6 (Nitro)"},
	{pfx("fd20:ce::254/128"), Metadata, "GCP metadata server over IPv6"},

	{pfx("0.0.0.0/8"), Unspecified, "RFC 1122 §3.2.1.3 (this host on this network)"},
	{pfx("127.0.0.0/8"), Loopback, "RFC 1122 §3.2.1.3"},
	{pfx("169.254.0.0/16"), LinkLocal, "RFC 3927 §2.1"},
	{pfx("10.0.0.0/8"), Private, "RFC 1918 §3"},
	{pfx("172.16.0.0/12"), Private, "RFC 1918 §3"},
	{pfx("192.168.0.0/16"), Private, "RFC 1918 §3"},
	{pfx("100.64.0.0/10"), CGNAT, "RFC 6598 §7"},
	{pfx("224.0.0.0/4"), Multicast, "RFC 5771 §2"},
	{pfx("255.255.255.255/32"), Broadcast, "RFC 919 §7 (limited broadcast)"},
	{pfx("192.0.0.0/24"), Reserved, "RFC 6890 §2.2.2 (IETF protocol assignments)"},
	{pfx("192.0.2.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-1)"},
	{pfx("198.18.0.0/15"), Reserved, "RFC 2544 §C.2.2 (benchmarking)"},
	{pfx("198.51.100.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-2)"},
	{pfx("203.0.113.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-3)"},
	{pfx("240.0.0.0/4"), Reserved, "RFC 1112 §4 (class E)"},

	{pfx("::/128"), Unspecified, "RFC 4291 §2.5.2"},
	{pfx("::1/128"), Loopback, "RFC 4291 §2.5.3"},
	{pfx("fe80::/10"), LinkLocal, "RFC 4291 §2.5.6"},
	{pfx("fc00::/7"), Private, "RFC 4193 §8 (unique local)"},
	{pfx("ff00::/8"), Multicast, "RFC 4291 §2.7"},
	{pfx("100::/64"), Reserved, "RFC 6666 §4 (discard-only)"},
	{pfx("2001:db8::/32"), Reserved, "RFC 3849 §4 (documentation)"},
	// Other ::/96 addresses are IPv4-compatible: see compatible, which
	// falls back to this row when the carried IPv4 address is public.
	{pfx("::/96"), Reserved, "RFC 4291 §2.5.5.1 (IPv4-compatible, deprecated)"},
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// table4 and table6 are table split by family, in table order, so a lookup
// scans only its own family's rows.
var table4, table6 = splitTable()

func splitTable() (v4, v6 []prefixClass) {
	for _, row := range table {
		if row.prefix.Addr().Is4() {
			v4 = append(v4, row)
		} else {
			v6 = append(v6, row)
		}
	}
	return v4, v6
}

// Classify returns the class of ip. The zone is ignored and an IPv4-mapped
// address is judged as the IPv4 address it maps. IPv6 addresses that carry an
// IPv4 address (see embedders) are judged by it; where one carries several,
// the most restrictive class wins. An invalid address is Unspecified, so it
// fails closed.
func Classify(ip netip.Addr) Class {
	js := judge(ip)
	return js.worst().class
}

// lookup returns the class of the first table row containing ip, which must
// be unmapped and without zone.
func lookup(ip netip.Addr) Class {
	rows := table6
	if ip.Is4() {
		rows = table4
	}
	for i := range rows {
		if rows[i].prefix.Contains(ip) {
			return rows[i].class
		}
	}
	return Public
}
