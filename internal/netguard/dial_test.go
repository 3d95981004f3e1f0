package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/netns"
)

// Outside a namespace these tests dial only 127.0.0.1. Every other address
// is dialled only in the body of netns.Run, with TestHookDial failing the test if
// the guard lets a dial it should block reach connect.

func listen(t *testing.T, addr string) *net.TCPListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.(*net.TCPListener)
}

func addrPortOf(ln net.Listener) netip.AddrPort {
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// assertNoAccept shows that no connection reached ln. A connect on this
// machine completes the handshake before it returns, so a connection that
// got through would already be waiting.
func assertNoAccept(t *testing.T, ln *net.TCPListener) {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Errorf("%s accepted a connection from %s, want none", ln.Addr(), c.RemoteAddr())
	}
}

func assertAccept(t *testing.T, ln *net.TCPListener) {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("%s accepted nothing: %v", ln.Addr(), err)
	}
	c.Close()
}

// failHook returns a TestHookDial that fails t for every address but allow.
func failHook(t *testing.T, allow ...netip.AddrPort) func(netip.AddrPort) error {
	return func(ap netip.AddrPort) error {
		for _, a := range allow {
			if ap == a {
				return nil
			}
		}
		t.Errorf("dial to %s reached connect: the guard should have blocked it", ap)
		return fmt.Errorf("test hook: %s must not be dialled", ap)
	}
}

// assertBlocked checks that err is a *net.OpError wrapping a *BlockedError
// of class want.
func assertBlocked(t *testing.T, what string, err error, want Class) {
	t.Helper()
	var blocked *BlockedError
	var op *net.OpError
	if !errors.As(err, &op) || !errors.As(err, &blocked) || blocked.Class != want {
		t.Errorf("%s = %v, want a *net.OpError wrapping a *BlockedError (%s)", what, err, want)
	}
}

func dialer(t *testing.T, o Options) *Dialer {
	t.Helper()
	return mustGuard(t, o).NewDialer(5 * time.Second)
}

func TestDialerUnsafeLoopback(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	d := dialer(t, Options{UnsafeAllowCIDRs: prefixes("127.0.0.0/8")})
	d.TestHookDial = failHook(t, addrPortOf(ln))
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("DialContext(%s) with 127/8 unsafe-open: %v", ln.Addr(), err)
	}
	c.Close()
	assertAccept(t, ln)
}

// TestDialerControlBlocksLoopback dials without Resolve: the Control hook is
// what blocks it, before connect.
func TestDialerControlBlocksLoopback(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	port := addrPortOf(ln).Port()
	d := dialer(t, Options{})
	d.TestHookDial = failHook(t)
	for _, addr := range []string{ln.Addr().String(), fmt.Sprintf("[::ffff:127.0.0.1]:%d", port)} {
		_, err := d.DialContext(context.Background(), "tcp", addr)
		assertBlocked(t, "DialContext("+addr+")", err, Loopback)
	}
	assertNoAccept(t, ln)
}

func TestDialerBlocksSelf(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	d := dialer(t, Options{UnsafeAllowCIDRs: prefixes("127.0.0.0/8"), Self: []netip.AddrPort{addrPortOf(ln)}})
	d.TestHookDial = failHook(t)
	_, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	assertBlocked(t, "DialContext(self)", err, Self)
	assertNoAccept(t, ln)
}

func TestDialerRefusesNames(t *testing.T) {
	d := dialer(t, Options{UnsafeAllowCIDRs: prefixes("127.0.0.0/8")})
	d.TestHookDial = failHook(t)
	for _, c := range []struct{ network, addr string }{
		{"tcp", "localhost:80"}, {"tcp", "example.com:443"}, {"tcp", "127.0.0.1"}, {"udp", "127.0.0.1:53"},
	} {
		conn, err := d.DialContext(context.Background(), c.network, c.addr)
		var blocked *BlockedError
		if err == nil || errors.As(err, &blocked) {
			t.Errorf("DialContext(%s, %s) = %v, %v; want refused before any lookup", c.network, c.addr, conn, err)
		}
	}
}

func TestDialAddrs(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	closed := listen(t, "127.0.0.1:0")
	closedAddr := addrPortOf(closed)
	closed.Close()

	d := dialer(t, Options{UnsafeAllowCIDRs: prefixes("127.0.0.1/32")})
	d.TestHookDial = failHook(t, addrPortOf(ln), closedAddr)
	c, err := d.DialAddrs(context.Background(), []netip.AddrPort{closedAddr, addrPortOf(ln)})
	if err != nil {
		t.Fatalf("DialAddrs(refused, open) = %v, want the second address", err)
	}
	c.Close()
	assertAccept(t, ln)

	// 127.0.0.2 is not opened: a blocked address ends the attempt, like a
	// blocked answer in Resolve, and the open address after it is not tried.
	blockedAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), addrPortOf(ln).Port())
	_, err = d.DialAddrs(context.Background(), []netip.AddrPort{blockedAddr, addrPortOf(ln)})
	assertBlocked(t, "DialAddrs(blocked, open)", err, Loopback)
	assertNoAccept(t, ln)

	if _, err := d.DialAddrs(context.Background(), nil); err == nil {
		t.Error("DialAddrs(nil) succeeded")
	}
}

// TestDialerBlocksInternal dials internal addresses in a loopback-only
// namespace, so even a broken guard could not reach them.
func TestDialerBlocksInternal(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		d := dialer(t, Options{})
		d.TestHookDial = failHook(t)
		for addr, want := range map[string]Class{
			"10.0.0.1:80": Private, "192.168.1.1:443": Private, "172.16.0.1:443": Private, "100.64.0.1:443": CGNAT,
			"169.254.169.254:80": Metadata, "169.254.170.2:80": Metadata, "100.100.100.200:80": Metadata,
			"[fd00:ec2::254]:80": Metadata, "[fd20:ce::254]:80": Metadata, "[::ffff:10.0.0.1]:80": Private,
			"[64:ff9b::a9fe:a9fe]:80": Metadata, "[2002:a00:1::]:80": Private, "[fe80::1%lo]:80": LinkLocal,
			"192.0.2.1:80": Reserved, "224.0.0.1:80": Multicast,
			"168.63.129.16:80": Metadata, "[::ffff:168.63.129.16]:80": Metadata, "169.254.170.23:80": Metadata,
			"[fd00:ec2::23]:80": Metadata, "[fd00:c1::a9fe:a9fe]:80": Metadata, "[fec0::1]:80": Private,
			"192.88.99.1:80": Reserved, "[3fff::1]:80": Reserved,
		} {
			_, err := d.DialContext(context.Background(), "tcp", addr)
			assertBlocked(t, "DialContext("+addr+")", err, want)
		}
	})
}

// TestDialerReachableInternal puts listeners on internal addresses that
// exist only in the namespace: the guard blocks them although they answer,
// and AllowCIDRs opens the private one but never metadata or self.
func TestDialerReachableInternal(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		for _, cidr := range []string{"10.0.0.5/32", "169.254.169.254/32", "fd00:ec2::254/128"} {
			netns.AddLoopbackAddr(t, cidr)
		}
		private := listen(t, "10.0.0.5:0")
		meta4 := listen(t, "169.254.169.254:0")
		meta6 := listen(t, "[fd00:ec2::254]:0")

		strict := dialer(t, Options{})
		strict.TestHookDial = failHook(t)
		_, err := strict.DialContext(context.Background(), "tcp", private.Addr().String())
		assertBlocked(t, "default guard, dial 10.0.0.5", err, Private)
		assertNoAccept(t, private)

		open := dialer(t, Options{
			AllowCIDRs:       prefixes("10.0.0.0/8", "0.0.0.0/0", "::/0"),
			UnsafeAllowCIDRs: prefixes("169.254.0.0/16", "fd00::/8"),
		})
		open.TestHookDial = failHook(t, addrPortOf(private))
		c, err := open.DialContext(context.Background(), "tcp", private.Addr().String())
		if err != nil {
			t.Fatalf("with 10/8 open, dial 10.0.0.5: %v", err)
		}
		c.Close()
		assertAccept(t, private)
		for _, ln := range []*net.TCPListener{meta4, meta6} {
			_, err := open.DialContext(context.Background(), "tcp", ln.Addr().String())
			assertBlocked(t, "every CIDR open, dial "+ln.Addr().String(), err, Metadata)
			assertNoAccept(t, ln)
		}

		self := dialer(t, Options{AllowCIDRs: prefixes("10.0.0.0/8"), Self: []netip.AddrPort{addrPortOf(private)}})
		self.TestHookDial = failHook(t)
		_, err = self.DialContext(context.Background(), "tcp", private.Addr().String())
		assertBlocked(t, "10/8 open, dial self on 10.0.0.5", err, Self)
		assertNoAccept(t, private)
	})
}
