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

// The address classes, the detail of an internal_address refusal (docs/reasons.md).
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

// table lists every classified prefix with its source: an RFC, or for a
// cloud address the vendor's documentation. The first matching row wins, so
// the metadata addresses come before the link-local, CGNAT, reserved and ULA
// ranges that contain them, and broadcast before 240.0.0.0/4.
//
// The IANA IPv4 and IPv6 Special-Purpose Address Registries were reviewed
// row by row. Blocks the registries mark globally reachable stay public, as
// they are ordinary Internet destinations: 192.0.0.9/32 and 192.0.0.10/32
// (inside 192.0.0.0/24 here all the same), 192.31.196.0/24, 192.52.193.0/24,
// 192.175.48.0/24, 2001:1::1/128, 2001:1::2/128, 2001:1::3/128, 2001:3::/32,
// 2001:4:112::/48, 2001:20::/28, 2001:30::/28 and 2620:4f:8000::/48. The
// IPv6 blocks that carry an IPv4 address (::ffff:0:0/96, 64:ff9b::/96,
// 64:ff9b:1::/48, 2002::/16, 2001::/32) are judged by it: see embedders.
var table = []prefixClass{
	// Cloud metadata and platform endpoints: always denied, whatever range
	// holds them.
	{pfx("169.254.169.254/32"), Metadata, "AWS docs: EC2 instance metadata service; GCP docs: metadata server; Azure docs: Instance Metadata Service; OCI docs: Getting Instance Metadata; DigitalOcean docs: Droplet Metadata API; IBM Cloud docs: VPC metadata service; OpenStack docs: metadata service"},
	{pfx("169.254.170.2/32"), Metadata, "AWS docs: ECS task metadata endpoint v2-v4 and task IAM role credentials"},
	{pfx("169.254.170.23/32"), Metadata, "AWS docs: EKS Pod Identity Agent (credentials)"},
	{pfx("169.254.0.23/32"), Metadata, "Tencent Cloud docs: CVM instance metadata (metadata.tencentyun.com)"},
	{pfx("100.100.100.200/32"), Metadata, "Alibaba Cloud docs: ECS instance metadata"},
	{pfx("168.63.129.16/32"), Metadata, "Azure docs: What is IP address 168.63.129.16 (WireServer, host node virtual public IP)"},
	{pfx("192.0.0.192/32"), Metadata, "Oracle docs: Compute Cloud@Customer and Cloud Classic instance metadata"},
	{pfx("fd00:ec2::254/128"), Metadata, "AWS docs: EC2 instance metadata service over IPv6 (Nitro)"},
	{pfx("fd00:ec2::23/128"), Metadata, "AWS docs: EKS Pod Identity Agent over IPv6 (credentials)"},
	{pfx("fd20:ce::254/128"), Metadata, "GCP docs: metadata server over IPv6 (IPv6-only instances)"},
	{pfx("fd00:c1::a9fe:a9fe/128"), Metadata, "OCI docs: instance metadata service over IPv6 (used by the OCI SDKs' instance principals signer)"},

	{pfx("0.0.0.0/8"), Unspecified, "RFC 791 §3.2, RFC 1122 §3.2.1.3 (this host on this network)"},
	{pfx("127.0.0.0/8"), Loopback, "RFC 1122 §3.2.1.3"},
	{pfx("169.254.0.0/16"), LinkLocal, "RFC 3927 §2.1"},
	{pfx("10.0.0.0/8"), Private, "RFC 1918 §3"},
	{pfx("172.16.0.0/12"), Private, "RFC 1918 §3"},
	{pfx("192.168.0.0/16"), Private, "RFC 1918 §3"},
	{pfx("100.64.0.0/10"), CGNAT, "RFC 6598 §7"},
	{pfx("224.0.0.0/4"), Multicast, "RFC 5771 §2"},
	{pfx("255.255.255.255/32"), Broadcast, "RFC 919 §7, RFC 8190 (limited broadcast)"},
	{pfx("192.0.0.0/24"), Reserved, "RFC 6890 §2.2.2 (IETF protocol assignments; includes RFC 7335, RFC 7600, RFC 8880)"},
	{pfx("192.0.2.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-1)"},
	{pfx("192.88.99.0/24"), Reserved, "RFC 7526 (deprecated 6to4 relay anycast)"},
	{pfx("198.18.0.0/15"), Reserved, "RFC 2544 §C.2.2 (benchmarking)"},
	{pfx("198.51.100.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-2)"},
	{pfx("203.0.113.0/24"), Reserved, "RFC 5737 §3 (TEST-NET-3)"},
	{pfx("240.0.0.0/4"), Reserved, "RFC 1112 §4 (class E)"},

	{pfx("::/128"), Unspecified, "RFC 4291 §2.5.2"},
	{pfx("::1/128"), Loopback, "RFC 4291 §2.5.3"},
	{pfx("fe80::/10"), LinkLocal, "RFC 4291 §2.5.6"},
	{pfx("fc00::/7"), Private, "RFC 4193 §8 (unique local)"},
	{pfx("fec0::/10"), Private, "RFC 3879 (deprecated site-local, still routed in some networks)"},
	{pfx("ff00::/8"), Multicast, "RFC 4291 §2.7"},
	{pfx("100::/64"), Reserved, "RFC 6666 §4 (discard-only)"},
	{pfx("2001:2::/48"), Reserved, "RFC 5180 and its erratum 1752 (benchmarking)"},
	{pfx("2001:10::/28"), Reserved, "RFC 4843 (ORCHID, deprecated)"},
	{pfx("2001:db8::/32"), Reserved, "RFC 3849 §4 (documentation)"},
	{pfx("3fff::/20"), Reserved, "RFC 9637 (documentation)"},
	{pfx("5f00::/16"), Reserved, "RFC 9602 (SRv6 SIDs, not globally reachable)"},
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
