// Package peeruid admits a loopback listener's connections by the user the
// connecting process runs as, read from the kernel's socket table (sock_diag,
// over vishvananda/netlink's netlink socket) in the listener's network namespace:
// what SO_PEERCRED is for a Unix socket. Each lookup asks for the one socket by
// its addresses (the kernel's exact lookup, a hash probe), never a dump of the
// namespace's sockets, so a flood of connections costs each lookup nothing. A node's sandbox and its agent runtime share a
// namespace, so its role: hooks listener tells the runtime apart by its UID, not
// by anything the connection says (docs/node.md).
package peeruid

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/netns"
)

// tcpEstablished is TCP_ESTABLISHED in the kernel's socket states.
const tcpEstablished = 1

// lookupTimeout bounds a lookup: the kernel answers at once.
const lookupTimeout = time.Second

// warnEvery bounds the WARN lines of refused connections: one per interval per
// listener, with the count since the last.
const warnEvery = 10 * time.Second

// Listener is a net.Listener whose Accept returns only connections whose peer
// runs as one of its UIDs; the others are closed as they are accepted.
type Listener struct {
	net.Listener
	uids []uint32
	name string
	log  zerolog.Logger

	mu      sync.Mutex       // serialises lookups: one netlink socket
	diag    *nl.SocketHandle // in the listener's namespace; nil once closed
	refused int              // since the last WARN
	warned  time.Time        // the last WARN
}

// Wrap returns ln admitting only peers that run as one of uids. ln must be a
// loopback TCP listener opened in the network namespace at netnsPath ("" for
// egressd's own): the lookup runs there.
func Wrap(ln net.Listener, netnsPath string, uids []uint32, name string, log zerolog.Logger) (*Listener, error) {
	var sock *nl.NetlinkSocket
	open := func() (err error) {
		sock, err = nl.GetNetlinkSocketAt(vnetns.None(), vnetns.None(), unix.NETLINK_INET_DIAG)
		return err
	}
	var err error
	if netnsPath == "" {
		err = open()
	} else {
		err = netns.Do(netnsPath, open) // the socket stays in the sandbox's namespace
	}
	if err != nil {
		return nil, fmt.Errorf("listener %q: peer_uids: the kernel's socket table: %w", name, err)
	}
	tv := unix.NsecToTimeval(lookupTimeout.Nanoseconds())
	if err := errors.Join(sock.SetSendTimeout(&tv), sock.SetReceiveTimeout(&tv)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("listener %q: peer_uids: %w", name, err)
	}
	return &Listener{Listener: ln, uids: slices.Clone(uids), name: name, log: log, diag: &nl.SocketHandle{Socket: sock}}, nil
}

// Accept returns the next connection whose peer runs as one of the UIDs.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := l.peer(c)
		if err == nil && slices.Contains(l.uids, uid) {
			return c, nil
		}
		c.Close()
		l.refuse(uid, err)
	}
}

// errNotLive is a peer socket that is no live connection of a process: gone, or
// closed and kept only by the kernel (its UID then reads 0).
var errNotLive = errors.New("the peer's socket is not an established connection of a live process")

// peer is the UID of the process at c's other end: the socket whose local
// address is c's remote one and whose remote address is c's local one.
func (l *Listener) peer(c net.Conn) (uint32, error) {
	local, lok := c.RemoteAddr().(*net.TCPAddr)
	remote, rok := c.LocalAddr().(*net.TCPAddr)
	if !lok || !rok {
		return 0, errors.New("not a TCP connection")
	}
	req, err := exactRequest(local, remote)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	if l.diag == nil {
		l.mu.Unlock()
		return 0, net.ErrClosed
	}
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_INET_DIAG: l.diag}
	msgs, err := req.Execute(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY)
	l.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if len(msgs) != 1 {
		return 0, fmt.Errorf("sock_diag: %d answers", len(msgs))
	}
	return parseDiag(msgs[0])
}

// refuse logs a refused connection: at most one WARN per warnEvery, with the
// count since the last.
func (l *Listener) refuse(uid uint32, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused++
	if time.Since(l.warned) < warnEvery {
		return
	}
	ev := l.log.Warn().Str("listener", l.name).Uint32("uid", uid).Int("refused", l.refused).Uints32("peer_uids", l.uids)
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg("connections refused: their process runs as no user of the listener's peer_uids")
	l.refused, l.warned = 0, time.Now()
}

// Close closes the listener and its netlink socket.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	if l.diag != nil {
		l.diag.Socket.Close()
		l.diag = nil
	}
	l.mu.Unlock()
	return err
}
