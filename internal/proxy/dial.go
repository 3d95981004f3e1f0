package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// dialError marks an error that happened while connecting, so that a connect timeout
// reads as upstream_unreachable rather than upstream_timeout.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// resolve turns a decided target into checked addresses: an IP literal is checked as
// is, a name is resolved once and every answer checked.
func (rt *Runtime) resolve(ctx context.Context, t allowlist.Target) ([]netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, rt.Limits.DNS)
	defer cancel()
	return rt.Guard.Resolve(ctx, rt.Resolver, t.Host, t.Addr, t.Port)
}

// dialTarget resolves, checks and dials t. The dialer checks each address again in
// its Control hook, so nothing unchecked is ever connected to.
func (rt *Runtime) dialTarget(ctx context.Context, t allowlist.Target) (net.Conn, error) {
	addrs, err := rt.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := rt.dialer.DialAddrs(ctx, addrs)
	if err != nil {
		var blocked *netguard.BlockedError
		if errors.As(err, &blocked) {
			return nil, err
		}
		return nil, &dialError{err}
	}
	return conn, nil
}

// dialGuarded is the transport's DialContext: addr is the normalised target that the
// request was decided on.
func (rt *Runtime) dialGuarded(ctx context.Context, _, addr string) (net.Conn, error) {
	t, err := targetFromAddr(addr)
	if err != nil {
		return nil, err
	}
	return rt.dialTarget(ctx, t)
}

// targetFromAddr turns host:port of a decided, normalised target back into it.
func targetFromAddr(addr string) (allowlist.Target, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return allowlist.Target{}, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return allowlist.Target{}, err
	}
	t := allowlist.Target{Host: host, Port: uint16(port)}
	if a, err := netip.ParseAddr(host); err == nil {
		t.Addr = a
	}
	return t, nil
}
