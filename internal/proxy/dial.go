package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

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
func (snap *Snapshot) resolve(ctx context.Context, t allowlist.Target) ([]netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, snap.Limits.DNS)
	defer cancel()
	return snap.Guard.Resolve(ctx, snap.Resolver, t.Host, t.Addr, t.Port)
}

// dialTarget resolves, checks and dials t. The dialer checks each address again in
// its Control hook, so nothing unchecked is ever connected to.
func (snap *Snapshot) dialTarget(ctx context.Context, t allowlist.Target) (net.Conn, error) {
	addrs, err := snap.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := snap.dialer.DialAddrs(ctx, addrs)
	if err != nil {
		var blocked *netguard.BlockedError
		if errors.As(err, &blocked) {
			return nil, err
		}
		return nil, &dialError{err}
	}
	return conn, nil
}

// targetKey is the request-context key of the target a request was decided on.
type targetKey struct{}

// withTarget returns ctx carrying t, the decided target: the only one the
// transports' dialers will connect to for the request (dialGuarded).
func withTarget(ctx context.Context, t allowlist.Target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// errNoTarget is a dial whose context carries no decided target: refused, never
// dialled by its address alone.
var errNoTarget = errors.New("dial without a decided target")

// decidedTarget is the target in ctx, which must be the one addr (the URL's
// host:port, from which the transports key their connections) was written from.
func decidedTarget(ctx context.Context, addr string) (allowlist.Target, error) {
	t, ok := ctx.Value(targetKey{}).(allowlist.Target)
	if !ok {
		return allowlist.Target{}, errNoTarget
	}
	if t.String() != addr {
		return allowlist.Target{}, fmt.Errorf("dial of %s for a request decided on %s", addr, t)
	}
	return t, nil
}

// dialGuarded is the transports' DialContext: it dials the decided target that the
// request's context carries (withTarget), resolved and checked, and nothing else.
func (snap *Snapshot) dialGuarded(ctx context.Context, _, addr string) (net.Conn, error) {
	t, err := decidedTarget(ctx, addr)
	if err != nil {
		return nil, err
	}
	return snap.dialTarget(ctx, t)
}
