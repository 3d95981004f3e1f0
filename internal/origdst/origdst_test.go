package origdst_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/origdst"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// Each test runs in a loopback-only namespace of its own (netns.Run), so the
// NAT rules it installs exist nowhere else and vanish with the namespace. The
// "remote" addresses (10.9.9.9, 2001:db8::9) are routed to lo there: a
// locally generated connect needs a route before the OUTPUT hook can
// REDIRECT it.

func TestGetIPv4Redirect(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		ln := listen(t, "tcp4", "127.0.0.1:0")
		routeLocal(t, "10.9.9.0/24")
		nat(t, "iptables", "-d", "10.9.9.9", "-p", "tcp", "--dport", "443", "-j", "REDIRECT", "--to-ports", port(ln))
		assertOrigDst(t, ln, "10.9.9.9:443", "10.9.9.9:443")
	})
}

func TestGetIPv6Redirect(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		ln := listen(t, "tcp6", "[::1]:0")
		routeLocal(t, "2001:db8::/64")
		nat(t, "ip6tables", "-d", "2001:db8::9", "-p", "tcp", "--dport", "443", "-j", "REDIRECT", "--to-ports", port(ln))
		assertOrigDst(t, ln, "[2001:db8::9]:443", "[2001:db8::9]:443")
	})
}

// TestGetIPv4OnDualStackListener shows an IPv4 connection accepted on an
// AF_INET6 socket ([::]:p, so the local address is ::ffff:127.0.0.1): Get
// still asks the IPv4 table and returns the address unmapped.
func TestGetIPv4OnDualStackListener(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		ln := listen(t, "tcp", "[::]:0")
		routeLocal(t, "10.9.9.0/24")
		nat(t, "iptables", "-d", "10.9.9.9", "-p", "tcp", "--dport", "80", "-j", "REDIRECT", "--to-ports", port(ln))
		assertOrigDst(t, ln, "10.9.9.9:80", "10.9.9.9:80")
	})
}

// TestGetNotRedirected shows the kernel's answer for a tracked connection no
// rule translated: its own local address.
func TestGetNotRedirected(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		ln := listen(t, "tcp4", "127.0.0.1:0")
		routeLocal(t, "10.9.9.0/24")
		// Any NAT rule turns conntrack on in the namespace.
		nat(t, "iptables", "-d", "10.9.9.9", "-p", "tcp", "--dport", "443", "-j", "REDIRECT", "--to-ports", port(ln))
		assertOrigDst(t, ln, ln.Addr().String(), ln.Addr().String())
	})
}

// TestGetUntracked shows a namespace without conntrack: an error, not a
// made-up address.
func TestGetUntracked(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		ln := listen(t, "tcp4", "127.0.0.1:0")
		c, done := dialAccept(t, ln, ln.Addr().String())
		defer done()
		got, err := origdst.Get(c)
		t.Logf("Get on an untracked connection: %v", err)
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOPROTOOPT) {
			t.Fatalf("Get on an untracked connection = %v, %v; want ENOENT or ENOPROTOOPT", got, err)
		}
	})
}

func TestGetNotTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := origdst.Get(a); !errors.Is(err, origdst.ErrNotTCP) {
		t.Fatalf("Get(net.Pipe) error = %v, want ErrNotTCP", err)
	}
}

// assertOrigDst dials target, accepts the connection on ln and checks Get.
func assertOrigDst(t *testing.T, ln net.Listener, target, want string) {
	t.Helper()
	c, done := dialAccept(t, ln, target)
	defer done()
	got, err := origdst.Get(c)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if w := netip.MustParseAddrPort(want); got != w {
		t.Fatalf("Get = %s, want %s (local address %s)", got, w, c.LocalAddr())
	}
}

// dialAccept connects to target and returns the connection ln accepted.
func dialAccept(t *testing.T, ln net.Listener, target string) (net.Conn, func()) {
	t.Helper()
	client, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	server, err := ln.Accept()
	if err != nil {
		client.Close()
		t.Fatalf("accept: %v", err)
	}
	return server, func() { server.Close(); client.Close() }
}

func listen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func port(ln net.Listener) string { return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) }

func routeLocal(t *testing.T, cidr string) {
	t.Helper()
	run(t, "ip", "route", "add", "local", cidr, "dev", "lo")
}

// nat appends a rule to the nat table's OUTPUT chain.
func nat(t *testing.T, tool string, rule ...string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("EGRESSD_REQUIRE_NETNS") != "" {
			t.Fatalf("%s not installed (scripts/install-netns-deps.sh installs it)", tool)
		}
		t.Skipf("%s not installed (scripts/install-netns-deps.sh installs it)", tool)
	}
	run(t, tool, append([]string{"-w", "-t", "nat", "-A", "OUTPUT"}, rule...)...)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
