package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"
)

// Resolver looks names up through network.resolver or the system resolver.
// Its own connections to the DNS server are not guarded: the server is
// operator configuration and is usually on an internal address.
type Resolver struct {
	res     *net.Resolver
	timeout time.Duration
}

// DNSError is the error of a failed lookup; callers map it to dns_failure.
// Err is the underlying error (a *net.DNSError for NXDOMAIN, SERVFAIL and
// timeouts, a context error when the caller gave up).
type DNSError struct {
	Host string
	Err  error
}

func (e *DNSError) Error() string { return "resolve " + e.Host + ": " + e.Err.Error() }

func (e *DNSError) Unwrap() error { return e.Err }

// errNoAnswers is the DNSError.Err of a lookup that succeeded with no A or
// AAAA records.
var errNoAnswers = errors.New("no A or AAAA records")

// NewResolver returns a Resolver that asks server (host:port) over UDP, and
// over TCP when an answer is truncated, or the system resolver when server is
// empty. timeout bounds each Lookup; zero or less leaves it to the context.
func NewResolver(server string, timeout time.Duration) *Resolver {
	r := &Resolver{res: &net.Resolver{}, timeout: timeout}
	if server != "" {
		var d net.Dialer
		r.res = &net.Resolver{
			PreferGo: true,
			Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, server) // the resolver picks udp or tcp
			},
		}
	}
	return r
}

// Lookup returns every A and AAAA answer for host: unmapped, de-duplicated,
// IPv4 first, each family in answer order. No answers is an error. Every
// error is a *DNSError.
func (r *Resolver) Lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	ips, err := r.res.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &DNSError{Host: host, Err: err}
	}
	if ips = normAnswers(ips); len(ips) == 0 {
		return nil, &DNSError{Host: host, Err: errNoAnswers}
	}
	return ips, nil
}

// normAnswers unmaps and de-duplicates ips, IPv4 addresses first.
func normAnswers(ips []netip.Addr) []netip.Addr {
	seen := make(map[netip.Addr]struct{}, len(ips))
	out := make([]netip.Addr, 0, len(ips))
	for _, want4 := range []bool{true, false} {
		for _, ip := range ips {
			ip = ip.WithZone("").Unmap()
			if _, dup := seen[ip]; dup || ip.Is4() != want4 {
				continue
			}
			seen[ip] = struct{}{}
			out = append(out, ip)
		}
	}
	return out
}

// Resolve returns the checked addresses to dial for host:port. An IP literal
// (addr valid) is checked as is. A name is looked up with r and every answer
// is checked: if any answer is blocked the whole lookup is refused with that
// answer's *BlockedError, since a mix of public and internal answers is how
// rebinding sets are built. Lookup failures are *DNSError.
func (g *Guard) Resolve(ctx context.Context, r *Resolver, host string, addr netip.Addr, port uint16) ([]netip.AddrPort, error) {
	ips := []netip.Addr{addr.Unmap()}
	if !addr.IsValid() {
		var err error
		if ips, err = r.Lookup(ctx, host); err != nil {
			return nil, err
		}
	}
	out := make([]netip.AddrPort, len(ips))
	for i, ip := range ips {
		out[i] = netip.AddrPortFrom(ip, port)
		if err := g.Check(out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
