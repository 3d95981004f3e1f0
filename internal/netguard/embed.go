package netguard

import "net/netip"

// judged is one address an IP is judged by, with its class.
type judged struct {
	addr  netip.Addr
	class Class
}

// judgement holds the addresses an IP is judged by: the IP itself, or the
// IPv4 addresses it carries. A fixed array keeps Check free of allocations.
type judgement struct {
	parts [4]judged
	n     int
}

func (j *judgement) add(a netip.Addr, c Class) {
	j.parts[j.n] = judged{a, c}
	j.n++
}

// worst returns the most restrictive part; the first one wins a tie.
func (j *judgement) worst() judged {
	w := j.parts[0]
	for _, p := range j.parts[1:j.n] {
		if p.class.rank() > w.class.rank() {
			w = p
		}
	}
	return w
}

// embedding is an IPv6 form that carries IPv4 addresses.
type embedding uint8

const (
	compatibleForm embedding = iota
	low32Form
	localNAT64Form
	sixToFourForm
	teredoForm
)

// embedder recognises one embedding by its prefix.
type embedder struct {
	prefix netip.Prefix
	cite   string
	form   embedding
}

// embedders lists the IPv6 forms judged by the IPv4 addresses they carry. An
// IPv4-mapped address (RFC 4291 §2.5.5.2) is unmapped before any of these.
var embedders = []embedder{
	{pfx("::/96"), "RFC 4291 §2.5.5.1 (IPv4-compatible, deprecated)", compatibleForm},
	{pfx("::ffff:0:0:0/96"), "RFC 2765 §2.1 (IPv4-translated, SIIT)", low32Form},
	{pfx("64:ff9b::/96"), "RFC 6052 §2.1 (NAT64 well-known prefix)", low32Form},
	{pfx("64:ff9b:1::/48"), "RFC 8215 §2 (NAT64 local-use prefix)", localNAT64Form},
	{pfx("2002::/16"), "RFC 3056 §2 (6to4)", sixToFourForm},
	{pfx("2001::/32"), "RFC 4380 §4 (Teredo)", teredoForm},
}

// judge returns the addresses ip is judged by, each with its class.
func judge(ip netip.Addr) (j judgement) {
	ip = ip.WithZone("").Unmap()
	if !ip.IsValid() {
		j.add(ip, Unspecified)
		return j
	}
	if ip.Is6() {
		for i := range embedders {
			if embedders[i].prefix.Contains(ip) && j.carry(embedders[i].form, ip) {
				return j
			}
		}
	}
	j.add(ip, lookup(ip))
	return j
}

// carry adds the IPv4 addresses ip carries in form f and reports false when
// ip is not an embedding after all. (A switch, not a func field: an indirect
// call would move j to the heap and cost Check an allocation.)
func (j *judgement) carry(f embedding, ip netip.Addr) bool {
	switch f {
	case compatibleForm:
		return compatible(j, ip)
	case localNAT64Form:
		return localNAT64(j, ip)
	case sixToFourForm:
		return sixToFour(j, ip)
	case teredoForm:
		return teredo(j, ip)
	}
	return low32(j, ip)
}

func (j *judgement) addV4(a [4]byte) {
	ip := netip.AddrFrom4(a)
	j.add(ip, lookup(ip))
}

// low32 judges by the last 32 bits.
func low32(j *judgement, ip netip.Addr) bool {
	b := ip.As16()
	j.addV4([4]byte(b[12:]))
	return true
}

// compatible judges ::a.b.c.d by a.b.c.d, since a kernel with a sit tunnel
// (Linux sit0) still sends it there over IPv4. :: and ::1 are not embeddings.
// ::/96 is reserved (RFC 4291 deprecated it), so an address whose IPv4 part is
// public is reserved, not public: the IPv4 class decides, but never below reserved.
func compatible(j *judgement, ip netip.Addr) bool {
	if ip == netip.IPv6Unspecified() || ip == netip.IPv6Loopback() {
		return false
	}
	low32(j, ip)
	if last := &j.parts[j.n-1]; last.class == Public {
		*last = judged{ip, lookup(ip)} // the ::/96 row
	}
	return true
}

// localNAT64 judges 64:ff9b:1::/48, whose operator picks the prefix length
// (RFC 6052 §2.2). The /96 layout (the last 32 bits) is always judged. When
// bits 48-95 are not all zero the address may be in the /48, /56 or /64
// layout, so those IPv4 addresses are judged too and the most restrictive
// wins. With bits 48-95 zero those layouts carry 0.0.0.x, which no gateway
// forwards. Bits 64-71 are the reserved "u" octet in every layout.
func localNAT64(j *judgement, ip netip.Addr) bool {
	low32(j, ip)
	b := ip.As16()
	if b[6]|b[7]|b[8]|b[9]|b[10]|b[11] != 0 {
		j.addV4([4]byte{b[6], b[7], b[9], b[10]})  // /48
		j.addV4([4]byte{b[7], b[9], b[10], b[11]}) // /56
		j.addV4([4]byte(b[9:13]))                  // /64
	}
	return true
}

// sixToFour judges 2002:a.b.c.d::/48 by a.b.c.d (bits 16-47).
func sixToFour(j *judgement, ip netip.Addr) bool {
	b := ip.As16()
	j.addV4([4]byte(b[2:6]))
	return true
}

// teredo judges by the server (bits 32-63) and by the client, whose address
// is the last 32 bits XOR 0xffffffff (RFC 4380 §4).
func teredo(j *judgement, ip netip.Addr) bool {
	b := ip.As16()
	j.addV4([4]byte(b[4:8]))
	client := [4]byte(b[12:])
	for i := range client {
		client[i] ^= 0xff
	}
	j.addV4(client)
	return true
}
