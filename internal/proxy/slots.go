package proxy

import (
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/membudget"
)

// A listener at limits.max_connections gives a new connection the slot of the
// connection that has waited longest for its client, at least evictAfter: an
// idle keep-alive connection, or one still sending a request head or
// ClientHello. A slow client (slowloris) can therefore hold connection slots
// only while nobody else needs them; the newcomer gets 503 overloaded only when
// every connection is serving or began its wait within evictAfter. Requests,
// tunnels and upstream waits are never evicted. When no waiting
// connection can make room, a pre-tool hook call may still take a slot of the
// listener's hook lane (lane.go); everything else gets 503.

// evicted marks a waitSince whose slot was taken by a newer connection.
const evicted = -1

// detailEvicted is the log detail of a connection evicted while it waited.
const detailEvicted = "evicted_waiting"

// evictAfter is how long a connection must have waited for its client before
// a newcomer may take its slot. A real client waits between the stages of its
// request — its CONNECT answered, its ClientHello or request head on the way —
// and under load, with the sandbox holding every slot, a newcomer arrives at
// such a moment all the time: the wait of a slow client is what eviction is
// for, not these. Evicting one closes it with no answer, which the runtime
// reads as "allow" when it is a hook call. A second is far beyond any stage of
// a real client's, and well within limits.read_header.
const evictAfter = time.Second

// slotWait bounds how long a new connection waits for an evicted connection to
// release its slot; beyond it the newcomer gets 503 after all.
const slotWait = 200 * time.Millisecond

// waitFor starts a wait for the client, bounded by d, that an overloaded listener
// may cut short.
func (c *conn) waitFor(d time.Duration) {
	c.nc.SetReadDeadline(time.Now().Add(d))
	c.waitSince.Store(time.Now().UnixNano())
}

// waited ends the wait and clears the read deadline. It is false when the
// connection was evicted meanwhile: the caller must close it without serving.
func (c *conn) waited() bool {
	v := c.waitSince.Load()
	if v == evicted || !c.waitSince.CompareAndSwap(v, 0) {
		return false
	}
	c.nc.SetReadDeadline(time.Time{})
	return true
}

// evictWaiting ends the wait of l's connection of the given kind (one holding a
// main slot, or one being admitted) that has waited longest, at least minWait,
// and reports whether there was one. Its slot is released when its goroutine
// ends.
//
// A keep-alive connection whose last request was a pre-tool hook call is never
// evicted: the runtime reuses it for its next call, and a close racing that
// reuse reaches the runtime as a reset, which it reads as "allow". A sandbox
// that fakes hook calls to keep such connections can therefore hold slots for
// limits.client_idle; newcomers then get the hook lane or 503 overloaded, which
// is what holding every slot earns anyway.
func (s *Server) evictWaiting(l *listener, kind slotKind, minWait time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var oldest *conn
		since := time.Now().Add(-minWait).UnixNano()
		for c := range l.bySlot[kind] {
			if w := c.waitSince.Load(); w > 0 && !c.hookKeepAlive.Load() && w <= since {
				oldest, since = c, w
			}
		}
		if oldest == nil {
			return false
		}
		if oldest.waitSince.CompareAndSwap(since, evicted) {
			oldest.nc.SetReadDeadline(time.Now())
			return true
		}
		// It began serving (or waiting anew) since the scan: look again.
	}
}

// acceptOverloaded serves nc, which arrived when l was full, in the slot of the
// longest-waiting connection; when every connection is serving, admit decides
// between the hook lane and 503.
func (s *Server) acceptOverloaded(l *listener, nc net.Conn) {
	if s.evictWaiting(l, slotMain, evictAfter) && takeSlot(l.sem, slotWait) {
		l.overflow.Add(-1)
		s.serveConn(l, nc)
		return
	}
	s.admit(l, nc, "")
}

// overflowPoll is how often a waiting accept loop looks again.
const overflowPoll = 5 * time.Millisecond

// overflowBoundFor, when set, replaces overflowBound's memory bound (tests).
var overflowBoundFor int64

// overflowBound is a listener's maxOverflow: the connections beyond its bound
// (being admitted, in the hook lane, cut and given cutLinger to send their call)
// are bounded by what they cost, not by a count a flood fills in milliseconds
// (membudget.OverflowConns), and a quarter of the file descriptors egressd may
// open.
func overflowBound() int64 {
	n := membudget.OverflowConns()
	if overflowBoundFor > 0 {
		n = overflowBoundFor
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
		n = min(n, int64(lim.Cur/4))
	}
	return max(n, hookLane+maxAdmitting)
}

// awaitRoom holds l's accept loop while l holds maxOverflow connections beyond
// its bound and no slot is free, or the memory budget has no room for one more
// connection. Newer connections then wait in the kernel's
// backlog, neither answered nor closed: accepted, each would have to be answered
// 503 or closed, which the runtime reads as "allow" when it is a hook call, or
// else an older connection closed in its place, which may be a real call mid-way.
func (s *Server) awaitRoom(l *listener) {
	for l.overflow.Load() >= l.maxOverflow && (len(l.sem) == cap(l.sem) || s.mem.Room() < membudget.ConnCost) &&
		!s.closing.Load() {
		time.Sleep(overflowPoll)
	}
}

// takeSlot takes a slot of sem, waiting up to d for one.
func takeSlot(sem chan struct{}, d time.Duration) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case sem <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}
