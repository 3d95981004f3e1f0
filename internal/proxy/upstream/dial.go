package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// DialError marks an error that happened while connecting, so that a connect
// timeout reads as upstream_unreachable rather than upstream_timeout.
type DialError struct{ Err error }

func (e *DialError) Error() string { return e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// resolve turns a decided target into checked addresses: an IP literal is checked as
// is, a name is resolved once and every answer checked.
func (c *Client) resolve(ctx context.Context, t allowlist.Target) ([]netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.Limits.DNS)
	defer cancel()
	return c.o.Guard.Resolve(ctx, c.o.Resolver, t.Host, t.Addr, t.Port)
}

// Dial resolves, checks and dials t, a decided target. The dialer checks each
// address again in its Control hook, so nothing unchecked is ever connected to.
func (c *Client) Dial(ctx context.Context, t allowlist.Target) (net.Conn, error) {
	addrs, err := c.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := c.dialer.DialAddrs(ctx, addrs)
	if err != nil {
		var blocked *netguard.BlockedError
		if errors.As(err, &blocked) {
			return nil, err
		}
		return nil, &DialError{err}
	}
	return conn, nil
}

// targetKey is the request-context key of the target a request was decided on.
type targetKey struct{}

// WithTarget returns ctx carrying t, the decided target: the only one the Client
// will connect to for a request with that context.
func WithTarget(ctx context.Context, t allowlist.Target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// ErrNoTarget is a dial whose context carries no decided target: refused, never
// dialled by its address alone.
var ErrNoTarget = errors.New("dial without a decided target")

// decidedTarget is the target in ctx, which must be the one addr (the URL's
// host:port, from which the transports key their connections) was written from.
func decidedTarget(ctx context.Context, addr string) (allowlist.Target, error) {
	t, ok := ctx.Value(targetKey{}).(allowlist.Target)
	if !ok {
		return allowlist.Target{}, ErrNoTarget
	}
	if t.String() != addr {
		return allowlist.Target{}, fmt.Errorf("dial of %s for a request decided on %s", addr, t)
	}
	return t, nil
}

// dialGuarded is the transports' DialContext: it dials the decided target that the
// request's context carries (WithTarget), resolved and checked, and nothing else.
func (c *Client) dialGuarded(ctx context.Context, _, addr string) (net.Conn, error) {
	t, err := decidedTarget(ctx, addr)
	if err != nil {
		return nil, err
	}
	return c.Dial(ctx, t)
}
