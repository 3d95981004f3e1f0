package sockets_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/sockets"
)

func listen(t *testing.T, sp sockets.Spec) *sockets.Socket {
	t.Helper()
	s, err := sockets.Listen(sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTake: a set hands each socket to the spec it serves, once: by name and
// network, at the configured address (any port for port 0, which only a named
// socket can match); an unnamed socket (systemd's) by its address alone.
func TestTake(t *testing.T) {
	named := listen(t, sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	udp := listen(t, sockets.Spec{Name: "dns", Network: sockets.UDP, Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	unnamed := listen(t, sockets.Spec{Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	set := &sockets.Set{}
	for _, s := range []*sockets.Socket{named, udp, unnamed} {
		set.Add(s)
	}
	for _, tc := range []struct {
		name string
		sp   sockets.Spec
		want *sockets.Socket
	}{
		{"another name", sockets.Spec{Name: "listener/other", Network: sockets.TCP, Addr: named.Addr}, nil},
		{"another network", sockets.Spec{Name: "listener/sandbox", Network: sockets.UDP, Addr: named.Addr}, nil},
		{"another port", sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP,
			Addr: netip.AddrPortFrom(named.Addr.Addr(), named.Addr.Port()+1)}, nil},
		{"another address", sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP,
			Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), named.Addr.Port())}, nil},
		{"port 0, by name", sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")}, named},
		{"taken already", sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP, Addr: named.Addr}, nil},
		{"udp by name and address", sockets.Spec{Name: "dns", Network: sockets.UDP, Addr: udp.Addr}, udp},
		{"unnamed, port 0 never", sockets.Spec{Name: "admin", Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")}, nil},
		{"unnamed, by address", sockets.Spec{Name: "admin", Network: sockets.TCP, Addr: unnamed.Addr}, unnamed},
	} {
		if got := set.Take(tc.sp); got != tc.want || (got != nil && got.Name != tc.sp.Name) {
			t.Errorf("%s: Take(%v) = %v, want %v named %s", tc.name, tc.sp, got, tc.want, tc.sp.Name)
		}
	}
	if rest := set.Rest(); len(rest) != 0 {
		t.Errorf("left over: %v", rest)
	}
}

// TestTakeWildcard: 0.0.0.0 and :: stand for each other (a dual-stack socket
// bound to 0.0.0.0 reports ::).
func TestTakeWildcard(t *testing.T) {
	s := listen(t, sockets.Spec{Network: sockets.TCP, Addr: netip.MustParseAddrPort("[::]:0")})
	set := &sockets.Set{}
	set.Add(s)
	sp := sockets.Spec{Name: "admin", Network: sockets.TCP, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), s.Addr.Port())}
	if got := set.Take(sp); got != s {
		t.Errorf("Take(%v) of a socket bound to %v: %v", sp, s.Addr, got)
	}
}

// TestPair: the DNS guard's UDP and TCP sockets share a port, port 0 included.
func TestPair(t *testing.T) {
	udp, tcp, err := sockets.Pair("dns", netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	defer tcp.Close()
	if udp.Addr != tcp.Addr || udp.Network != sockets.UDP || tcp.Network != sockets.TCP || udp.PacketConn() == nil || tcp.Listener() == nil {
		t.Errorf("pair: %+v and %+v", udp.Spec, tcp.Spec)
	}
}

// TestHandover: the files a worker inherits are the set's sockets (the same
// bound address), and the variable names each, in order.
func TestHandover(t *testing.T) {
	set := &sockets.Set{}
	set.Add(listen(t, sockets.Spec{Name: "listener/sandbox", Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")}))
	set.Add(listen(t, sockets.Spec{Name: "dns", Network: sockets.UDP, Addr: netip.MustParseAddrPort("127.0.0.1:0")}))
	files, env, err := set.Handover()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if env != "listener/sandbox:tcp,dns:udp" || len(files) != 2 {
		t.Fatalf("handover: %d files, %q", len(files), env)
	}
	ln, err := net.FileListener(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := ln.Addr().String(); got != set.Get(sockets.TCP, "listener/sandbox").Addr.String() {
		t.Errorf("the handed-over listener is bound to %s, the set's to %s", got, set.Get(sockets.TCP, "listener/sandbox").Addr)
	}
}

// TestHolder: a port in use names the process holding it, over TCP (a
// listening socket, also behind the wildcard address) and UDP; a free port
// names nobody.
func TestHolder(t *testing.T) {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skip("no /proc")
	}
	want := fmt.Sprintf("pid %d (%s)", os.Getpid(), strings.TrimSpace(string(comm)))
	tcp := listen(t, sockets.Spec{Network: sockets.TCP, Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	udp := listen(t, sockets.Spec{Network: sockets.UDP, Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	wild := listen(t, sockets.Spec{Network: sockets.TCP, Addr: netip.MustParseAddrPort("0.0.0.0:0")})
	for _, tc := range []struct {
		network string
		addr    netip.AddrPort
		want    string
	}{
		{sockets.TCP, tcp.Addr, want},
		{sockets.UDP, udp.Addr, want},
		{sockets.TCP, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), wild.Addr.Port()), want},
		{sockets.UDP, tcp.Addr, ""}, // nobody holds that port over UDP
	} {
		if got := sockets.Holder(tc.network, tc.addr); got != tc.want {
			t.Errorf("Holder(%s %s) = %q, want %q", tc.network, tc.addr, got, tc.want)
		}
	}
}
