package netguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Options configures a Guard. The zero value is the strictest guard: every
// class but Public is denied.
type Options struct {
	// AllowCIDRs opens the private, cgnat and reserved addresses they
	// contain (network.allow_cidrs). A prefix that overlaps an always-denied
	// class does not open that class: 0.0.0.0/0 opens 10.0.0.1, never
	// 127.0.0.1 or 169.254.169.254.
	AllowCIDRs []netip.Prefix
	// UnsafeAllowCIDRs opens every class they contain except metadata and
	// self (network.unsafe_allow_cidrs). Development and tests only: it can
	// open loopback, so the caller logs a WARN at start (see Guard.Unsafe).
	UnsafeAllowCIDRs []netip.Prefix
	// Self lists egressd's own listener and admin addresses, which are never
	// dialled. An unspecified address (0.0.0.0:p, [::]:p) means every local
	// address with port p: loopback plus the interface addresses at New.
	Self []netip.AddrPort
	// Live lists more of egressd's listener addresses, which come and go while
	// the Guard serves (a node's sandboxes' listeners outside a namespace of
	// their own); nil for none.
	Live *SelfSet
}

// Guard decides whether an address may be dialled. It is immutable and safe
// for concurrent use.
type Guard struct {
	allow, unsafe []netip.Prefix
	self          map[netip.AddrPort]struct{} // exact listener addresses
	selfPorts     map[uint16]struct{}         // ports of every Self entry
	wildPorts     map[uint16]struct{}         // ports bound on an unspecified address
	local         map[netip.Addr]struct{}     // interface addresses at New, for wildPorts
	live          *SelfSet
}

// BlockedError is the error of a denied address. Callers map it to the
// internal_address reason with Class as the detail.
type BlockedError struct {
	Addr  netip.AddrPort
	Class Class
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("%s is a blocked address (%s)", e.Addr, e.Class)
}

// New validates o and builds a Guard. A prefix that can open nothing (say
// 127.0.0.0/8 in AllowCIDRs) is an error that names the fix.
func New(o Options) (*Guard, error) {
	g := &Guard{
		self:      map[netip.AddrPort]struct{}{},
		selfPorts: map[uint16]struct{}{},
		wildPorts: map[uint16]struct{}{},
		local:     map[netip.Addr]struct{}{},
		live:      o.Live,
	}
	var errs []error
	g.allow = normPrefixes("allow_cidrs", o.AllowCIDRs, allowOpens, &errs)
	g.unsafe = normPrefixes("unsafe_allow_cidrs", o.UnsafeAllowCIDRs, unsafeOpens, &errs)
	if err := g.addSelf(o.Self); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("netguard: %w", err)
	}
	return g, nil
}

// allowOpens reports whether AllowCIDRs may open c.
func allowOpens(c Class) bool { return c == Private || c == CGNAT || c == Reserved }

// unsafeOpens reports whether UnsafeAllowCIDRs may open c.
func unsafeOpens(c Class) bool { return c != Metadata && c != Self }

// normPrefixes masks each prefix, turns an IPv4-mapped prefix into its IPv4
// form (Check compares unmapped addresses) and rejects prefixes that lie
// wholly inside a class that opens cannot open.
func normPrefixes(key string, ps []netip.Prefix, opens func(Class) bool, errs *[]error) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if !p.IsValid() {
			*errs = append(*errs, fmt.Errorf("network.%s: %q is not a valid CIDR", key, p))
			continue
		}
		p = unmapPrefix(p.Masked())
		if c, ok := wholeClass(p); ok && !opens(c) {
			*errs = append(*errs, fmt.Errorf("network.%s: %s is %s, which %s can never open%s", key, p, c, key, hint(key, c)))
			continue
		}
		out = append(out, p)
	}
	return out
}

func hint(key string, c Class) string {
	if key == "allow_cidrs" && c != Metadata {
		return "; use unsafe_allow_cidrs (development only)"
	}
	return "; remove it"
}

// unmapPrefix turns ::ffff:a.b.c.d/n (n >= 96) into a.b.c.d/(n-96).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// wholeClass returns the class of the table row that contains all of p.
func wholeClass(p netip.Prefix) (Class, bool) {
	for _, row := range table {
		if row.prefix.Bits() <= p.Bits() && row.prefix.Contains(p.Addr()) {
			return row.class, true
		}
	}
	return Public, false
}

// addSelf records the Self addresses; an unspecified one expands to every
// local address with its port.
func (g *Guard) addSelf(self []netip.AddrPort) error {
	for _, ap := range self {
		if !ap.IsValid() {
			return fmt.Errorf("self address %q is not a valid ip:port", ap)
		}
		a := ap.Addr().WithZone("").Unmap()
		g.selfPorts[ap.Port()] = struct{}{}
		if a.IsUnspecified() {
			g.wildPorts[ap.Port()] = struct{}{}
			continue
		}
		g.self[netip.AddrPortFrom(a, ap.Port())] = struct{}{}
	}
	if len(g.wildPorts) == 0 {
		return nil
	}
	return g.addLocal()
}

// addLocal snapshots the interface addresses. The Guard is immutable, so an
// address added to the host later is not Self (but is still classified).
func (g *Guard) addLocal() error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("listing local addresses for a wildcard self address: %w", err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			g.local[p.Addr().WithZone("").Unmap()] = struct{}{}
		}
	}
	return nil
}

// Unsafe reports whether UnsafeAllowCIDRs is in use; the caller logs a WARN
// at start.
func (g *Guard) Unsafe() bool { return len(g.unsafe) > 0 }

// Check returns nil when addr may be dialled, else a *BlockedError. Self is
// checked first (the address and every IPv4 address it carries), then the
// class of each address it is judged by; UnsafeAllowCIDRs, then AllowCIDRs
// can open what their rules allow. Check does not allocate unless it blocks.
func (g *Guard) Check(addr netip.AddrPort) error {
	ip := addr.Addr().WithZone("").Unmap()
	j := judge(ip)
	if g.isSelf(ip, addr.Port()) || g.carriesSelf(&j, addr.Port()) {
		return &BlockedError{Addr: addr, Class: Self}
	}
	for _, p := range j.parts[:j.n] {
		if !g.opened(ip, p) {
			return &BlockedError{Addr: addr, Class: p.class}
		}
	}
	return nil
}

func (g *Guard) carriesSelf(j *judgement, port uint16) bool {
	for _, p := range j.parts[:j.n] {
		if g.isSelf(p.addr, port) {
			return true
		}
	}
	return false
}

// isSelf reports whether ip:port reaches one of egressd's listeners. A
// connect to 0.0.0.0 or :: reaches the local host, so it is Self on any
// listener port.
func (g *Guard) isSelf(ip netip.Addr, port uint16) bool {
	if g.live.has(ip, port) {
		return true
	}
	if len(g.selfPorts) == 0 {
		return false
	}
	if _, ok := g.self[netip.AddrPortFrom(ip, port)]; ok {
		return true
	}
	if _, ok := g.selfPorts[port]; !ok {
		return false
	}
	if ip.IsUnspecified() {
		return true
	}
	if _, ok := g.wildPorts[port]; !ok {
		return false
	}
	_, local := g.local[ip]
	return local || ip.IsLoopback()
}

// opened reports whether p may be dialled: it is public, or a prefix that
// may open its class contains p's address or the address ip that carries it.
func (g *Guard) opened(ip netip.Addr, p judged) bool {
	if p.class == Public {
		return true
	}
	return (unsafeOpens(p.class) && covers(g.unsafe, ip, p.addr)) ||
		(allowOpens(p.class) && covers(g.allow, ip, p.addr))
}

func covers(ps []netip.Prefix, ip, carried netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) || p.Contains(carried) {
			return true
		}
	}
	return false
}
