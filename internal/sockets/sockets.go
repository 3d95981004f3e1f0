// Package sockets keeps egressd's listening sockets apart from the process that
// serves them. They are opened once, by the supervising parent (or handed to it by
// systemd socket activation), passed to each worker as inherited file descriptors
// and rebuilt there as a net.Listener or net.PacketConn. A worker that dies leaves
// them open in the parent, so the connections that arrive meanwhile wait in the
// kernel's backlog for the next worker instead of meeting "connection refused"
// (docs/configuration.md, "Process model").
//
// The package knows sockets, not config: the caller names each one (Spec.Name)
// and says where it listens.
package sockets

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
)

// The networks of a Spec.
const (
	TCP = "tcp"
	UDP = "udp"
)

// Spec is one socket egressd serves.
type Spec struct {
	// Name identifies the socket across processes: the caller's choice, made of
	// characters that are not ':' or ','. A UDP and a TCP socket may share one.
	Name    string
	Network string         // TCP or UDP
	Addr    netip.AddrPort // as configured; port 0 picks a free port
}

func (sp Spec) String() string { return sp.Name + " (" + sp.Network + " " + sp.Addr.String() + ")" }

// Socket is one open socket: a TCP listener or a UDP socket.
type Socket struct {
	Spec // Addr is the bound address
	ln   net.Listener
	pc   net.PacketConn
}

// Listener is the TCP listener (nil for UDP).
func (s *Socket) Listener() net.Listener { return s.ln }

// PacketConn is the UDP socket (nil for TCP).
func (s *Socket) PacketConn() net.PacketConn { return s.pc }

// Close closes the socket in this process.
func (s *Socket) Close() error {
	if s.ln != nil {
		return s.ln.Close()
	}
	return s.pc.Close()
}

// file is a duplicate of the socket's descriptor, to hand to another process.
func (s *Socket) file() (*os.File, error) {
	type filer interface{ File() (*os.File, error) }
	var f filer
	var ok bool
	if s.ln != nil {
		f, ok = s.ln.(filer)
	} else {
		f, ok = s.pc.(filer)
	}
	if !ok {
		return nil, fmt.Errorf("socket %s: no file descriptor to hand over", s.Spec)
	}
	return f.File()
}

// Listen opens the socket sp describes. Go's listeners set SO_REUSEADDR, so a
// port whose previous owner left connections in TIME_WAIT is free again at once.
func Listen(sp Spec) (*Socket, error) {
	switch sp.Network {
	case TCP:
		ln, err := net.Listen("tcp", sp.Addr.String())
		if err != nil {
			return nil, err
		}
		return newListener(sp.Name, ln), nil
	case UDP:
		pc, err := net.ListenPacket("udp", sp.Addr.String())
		if err != nil {
			return nil, err
		}
		return newPacketConn(sp.Name, pc), nil
	}
	return nil, fmt.Errorf("socket %s: unknown network %q", sp.Name, sp.Network)
}

// pairAttempts is how often ListenPair tries again when the port is 0 and the
// free UDP port it got is taken for TCP.
const pairAttempts = 16

// ListenPair opens a UDP socket and a TCP listener on one port of addr (the DNS
// guard's): port 0 picks a port free for both.
func ListenPair(addr netip.AddrPort) (net.PacketConn, net.Listener, error) {
	for attempt := 0; ; attempt++ {
		pc, err := net.ListenPacket("udp", addr.String())
		if err != nil {
			return nil, nil, err
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", net.JoinHostPort(addr.Addr().String(), strconv.Itoa(port)))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if addr.Port() != 0 || attempt == pairAttempts {
			return nil, nil, err
		}
	}
}

// Pair is ListenPair's two sockets, both named name.
func Pair(name string, addr netip.AddrPort) (udp, tcp *Socket, err error) {
	pc, ln, err := ListenPair(addr)
	if err != nil {
		return nil, nil, err
	}
	return newPacketConn(name, pc), newListener(name, ln), nil
}

func newListener(name string, ln net.Listener) *Socket {
	return &Socket{Spec: Spec{Name: name, Network: TCP, Addr: boundAddr(ln.Addr())}, ln: ln}
}

func newPacketConn(name string, pc net.PacketConn) *Socket {
	return &Socket{Spec: Spec{Name: name, Network: UDP, Addr: boundAddr(pc.LocalAddr())}, pc: pc}
}

// boundAddr is a listener's or socket's local address as an AddrPort, an IPv4
// address in its 4-byte form.
func boundAddr(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Set is a collection of open sockets, each taken once by whoever serves it.
type Set struct {
	socks []*Socket
}

// Add adds s to the set.
func (set *Set) Add(s *Socket) { set.socks = append(set.socks, s) }

// Len is how many sockets the set holds.
func (set *Set) Len() int {
	if set == nil {
		return 0
	}
	return len(set.socks)
}

// Take removes and returns the socket that serves sp, named as sp: the same
// network, and the same name (a socket without a name, as systemd hands over,
// matches any), bound where sp asks (any port when sp's port is 0; the wildcard
// addresses 0.0.0.0 and :: stand for each other). Nil when the set holds none:
// the config changed since the sockets were opened, or systemd was not told
// about this one.
func (set *Set) Take(sp Spec) *Socket {
	if set == nil {
		return nil
	}
	for i, s := range set.socks {
		if s.Network != sp.Network || (s.Name != "" && s.Name != sp.Name) || !serves(s.Addr, sp.Addr, s.Name != "") {
			continue
		}
		set.socks = append(set.socks[:i], set.socks[i+1:]...)
		s.Name = sp.Name
		return s
	}
	return nil
}

// serves reports whether a socket bound at bound serves the configured address
// want. A port of 0 is a choice only a named socket (one this egressd opened) can
// have made.
func serves(bound, want netip.AddrPort, named bool) bool {
	if want.Port() == 0 {
		return named && sameAddr(bound.Addr(), want.Addr())
	}
	return bound.Port() == want.Port() && sameAddr(bound.Addr(), want.Addr())
}

func sameAddr(a, b netip.Addr) bool {
	a, b = a.Unmap(), b.Unmap()
	return a == b || (a.IsUnspecified() && b.IsUnspecified())
}

// Get is the socket of network named name, which the set keeps; nil when it
// holds none.
func (set *Set) Get(network, name string) *Socket {
	if set == nil {
		return nil
	}
	for _, s := range set.socks {
		if s.Network == network && s.Name == name {
			return s
		}
	}
	return nil
}

// Rest removes and returns the sockets no one took.
func (set *Set) Rest() []*Socket {
	if set == nil {
		return nil
	}
	rest := set.socks
	set.socks = nil
	return rest
}

// Close closes every socket the set still holds.
func (set *Set) Close() {
	for _, s := range set.Rest() {
		s.Close()
	}
}

// errNoSockets is FromEnv's error when the variable names no socket.
var errNoSockets = errors.New("no sockets")
