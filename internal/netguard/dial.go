package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// minAttempt is the least time one address gets when DialAddrs splits its
// timeout between several addresses (net.Dialer uses the same floor).
const minAttempt = 2 * time.Second

// Dialer dials checked literal addresses only, and checks every address again
// in net.Dialer.Control, just before connect: that closes DNS rebinding
// between Resolve and the dial, and catches any path that skipped Resolve.
type Dialer struct {
	guard   *Guard
	net     net.Dialer
	timeout time.Duration

	// TestHookDial, when non-nil, is called from Control with every address
	// that passed the guard, just before connect; an error it returns fails
	// that dial instead of connecting. Tests set it to fail the test if a
	// dial they expect the guard to block gets this far. Set it before the
	// first dial; production code leaves it nil.
	TestHookDial func(netip.AddrPort) error
}

// NewDialer returns a Dialer guarded by g. timeout bounds each DialContext
// or DialAddrs call as a whole; zero or less leaves it to the context.
func (g *Guard) NewDialer(timeout time.Duration) *Dialer {
	d := &Dialer{guard: g, timeout: timeout}
	d.net.Control = d.control
	return d
}

// DialContext dials a literal "ip:port" over network "tcp", "tcp4" or
// "tcp6". A host name is refused, never resolved: resolve it with
// Guard.Resolve and use DialAddrs. A blocked address fails with a
// *net.OpError wrapping a *BlockedError (use errors.As).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("netguard: refusing to dial network %q: only tcp is supported", network)
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, fmt.Errorf("netguard: refusing to dial %q: not a literal ip:port (resolve with Guard.Resolve first)", address)
	}
	return d.dial(ctx, network, []netip.AddrPort{ap})
}

// DialAddrs dials addrs in order and returns the first connection made,
// splitting the timeout between the addresses that are left. A blocked
// address ends the attempt at once, like a blocked answer in Resolve;
// otherwise the first error is returned.
func (d *Dialer) DialAddrs(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	return d.dial(ctx, "tcp", addrs)
}

func (d *Dialer) dial(ctx context.Context, network string, addrs []netip.AddrPort) (net.Conn, error) {
	if len(addrs) == 0 {
		return nil, errors.New("netguard: no addresses to dial")
	}
	if d.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	var first error
	for i, ap := range addrs {
		c, err := d.dialOne(ctx, network, ap, len(addrs)-i)
		if err == nil {
			return c, nil
		}
		var blocked *BlockedError
		if errors.As(err, &blocked) || ctx.Err() != nil {
			return nil, err
		}
		if first == nil {
			first = err
		}
	}
	return nil, first
}

// dialOne dials ap with its share of the time left for the remaining left
// addresses.
func (d *Dialer) dialOne(ctx context.Context, network string, ap netip.AddrPort, left int) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok && left > 1 {
		share := max(time.Until(dl)/time.Duration(left), minAttempt)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, share)
		defer cancel()
	}
	return d.net.DialContext(ctx, network, ap.String())
}

// control is the net.Dialer.Control hook: it runs after the socket is made
// and before connect, on the address actually being dialled.
func (d *Dialer) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("netguard: refusing to connect to unparsable address %q: %w", address, err)
	}
	if err := d.guard.Check(ap); err != nil {
		return err
	}
	if d.TestHookDial != nil {
		return d.TestHookDial(ap)
	}
	return nil
}
