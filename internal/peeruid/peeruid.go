// Package peeruid admits a loopback listener's connections by the user the
// connecting process runs as, read from the kernel's socket table (sock_diag,
// through vishvananda/netlink) in the listener's network namespace: what
// SO_PEERCRED is for a Unix socket. A node's sandbox and its agent runtime share a
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
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/netns"
)

// tcpEstablished is TCP_ESTABLISHED in the kernel's socket states.
const tcpEstablished = 1

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

	mu      sync.Mutex      // serialises lookups: one netlink socket
	h       *netlink.Handle // nil once closed
	refused int             // since the last WARN
	warned  time.Time       // the last WARN
}

// Wrap returns ln admitting only peers that run as one of uids. ln must be a
// loopback TCP listener opened in the network namespace at netnsPath ("" for
// egressd's own): the lookup runs there.
func Wrap(ln net.Listener, netnsPath string, uids []uint32, name string, log zerolog.Logger) (*Listener, error) {
	var h *netlink.Handle
	open := func() (err error) {
		h, err = netlink.NewHandle(unix.NETLINK_INET_DIAG)
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
	return &Listener{Listener: ln, uids: slices.Clone(uids), name: name, log: log, h: h}, nil
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

// peer is the UID of the process at c's other end: the socket whose source is
// c's remote address and whose destination is c's local one.
func (l *Listener) peer(c net.Conn) (uint32, error) {
	l.mu.Lock()
	if l.h == nil {
		l.mu.Unlock()
		return 0, net.ErrClosed
	}
	s, err := l.h.SocketGet(c.RemoteAddr(), c.LocalAddr())
	l.mu.Unlock()
	switch {
	case err != nil:
		return 0, err
	case s.INode == 0 || s.State != tcpEstablished:
		return s.UID, errNotLive
	}
	return s.UID, nil
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
	if l.h != nil {
		l.h.Close()
		l.h = nil
	}
	l.mu.Unlock()
	return err
}
