package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/origdst"
)

// The hook lane keeps a pre-tool hook call answered when the sandbox holds every
// connection slot (slow bodies, clients that never read, held tunnels; DESIGN.md
// "Hooks"). The runtime reads a 503 or a reset as "allow", so at
// limits.max_connections, with no waiting connection to evict (slots.go), a
// newcomer is admitted: egressd reads its first head, bounded in size (one read
// buffer) and time (admitHead), without a slot. A pre-tool hook call — a POST to
// a pre_tool_execution URL, a CONNECT to a hook host, or on a transparent listener
// a ClientHello whose SNI is a hook host or a plain POST to a hook URL — takes one
// of hookLane slots kept apart for it; everything else gets 503 overloaded.
//
// The sandbox can fake a hook call (it may POST to the hook URL itself), so the
// lane is bounded too:
//   - a lane connection serves one request, only a pre-tool hook call (anything
//     else: 503 overloaded), and lives at most laneLife;
//   - when the lane is full, the newcomer cuts the connection that took its lane
//     slot first: a hook call in progress there is answered with egressd's
//     fail-closed deny (its body read and its forward end at once), and the
//     connection is closed within cutGrace whatever it does.
//
// So a real hook call, the newest arrival, gets its lane slot within laneWait and
// then the endpoint's answer or the deny within its timeout, never a 503; the
// attacker can at most turn its own tool calls into denies.
const (
	hookLane  = 32                     // lane slots per listener
	admitHead = 2 * time.Second        // the newcomer's first head must arrive within this
	laneWait  = 500 * time.Millisecond // a newcomer waits this long for a cut connection's slot
	cutGrace  = time.Second            // a cut connection is closed after this, answered or not
	// Connections being admitted at once: beyond maxAdmitting, the oldest that
	// has waited evictAfter for its head is cut (a younger one may be a real
	// call whose head is on the way); beyond maxAdmittingHard, the oldest
	// whatever its wait, which bounds what a flood of silent connections holds.
	maxAdmitting     = 64
	maxAdmittingHard = 4 * maxAdmitting
	// A cut connection that has not begun its call yet (still in its TLS
	// handshake, or sending its head: under load, a real call's) may take up to
	// cutLinger to send it and get the deny, rather than a close the runtime
	// would read as allow; at most maxLingering at once per listener, beyond
	// which the one cut longest ago keeps cutGrace only (lingerQueue). They
	// hold no slot.
	cutLinger    = 5 * time.Second
	maxLingering = 2 * hookLane
)

// slotKind is what a connection holds.
type slotKind uint8

const (
	slotMain  slotKind = iota // one of limits.max_connections
	slotAdmit                 // none: being admitted to the lane
	slotLane                  // one of hookLane
)

// admit reads nc's first head and serves a pre-tool hook call in the lane, or
// answers anything else 503 overloaded.
func (s *Server) admit(l *listener, nc net.Conn) {
	rt := s.Runtime()
	c := newConn(s, l, nc)
	c.slot = slotAdmit
	if !s.trackConn(c, true) {
		nc.Close()
		return
	}
	if n := s.admitting(l); n > maxAdmitting {
		s.evictWaiting(l, slotAdmit, admitEvictAfter(n))
	}
	c.waitFor(admitHead)
	candidate := c.hookCandidate(rt)
	evicted := !c.waited()
	s.trackConn(c, false)
	switch {
	case evicted:
		nc.Close()
	case !candidate:
		c.rejectOverloaded()
	default:
		s.serveLane(l, c, rt)
	}
}

// admitEvictAfter is how long the connection cut for the n-th admission must
// have waited for its head.
func admitEvictAfter(n int) time.Duration {
	if n > maxAdmittingHard {
		return 0
	}
	return evictAfter
}

// admitting counts l's connections being admitted.
func (s *Server) admitting(l *listener) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if c.l == l && c.slot == slotAdmit {
			n++
		}
	}
	return n
}

// serveLane serves c in a lane slot, cutting the oldest lane connection when
// the lane is full. When no slot comes within laneWait (newcomers took the one
// it freed), c is served cut from the start, holding no slot: its call gets the
// deny within cutLinger, as a cut connection's does, rather than a close before
// it could send it.
func (s *Server) serveLane(l *listener, c *conn, rt *Runtime) {
	sem := l.lane
	if !takeSlot(l.lane, 0) && !(s.cutOldestLane(l) && takeSlot(l.lane, laneWait)) {
		sem = make(chan struct{}, 1) // a slot of its own, given back by the cut
		sem <- struct{}{}
	}
	c.slot, c.lane, c.laneAt = slotLane, true, time.Now()
	c.cutCtx, c.cutFn = context.WithCancel(context.Background())
	c.laneRoot = c
	time.AfterFunc(laneLife(rt), c.cut)
	s.serveIn(c, sem)
	if sem != l.lane {
		c.cut()
	}
}

// laneLife bounds a lane connection: its TLS handshake and head, then the longest
// hook deadline, then a second to write the answer.
func laneLife(rt *Runtime) time.Duration {
	longest := time.Duration(0)
	for _, m := range rt.Hooks.Index.Matches() {
		longest = max(longest, hooks.Deadline(m.Timeout))
	}
	return 2*rt.Limits.ReadHeader + longest + time.Second
}

// cutOldestLane cuts one of l's lane connections and reports whether there was
// one: the oldest of those already in a hook call (a body trickling in, an
// endpoint slow to answer: the call is answered with the deny at once), else the
// oldest. A real call that is still in its handshake is the newest arrival, and
// the last to be cut.
func (s *Server) cutOldestLane(l *listener) bool {
	s.mu.Lock()
	var oldest *conn
	for c := range s.conns {
		if c.l == l && c.laneRoot == c && !c.isCut.Load() && cutsBefore(c, oldest) {
			oldest = c
		}
	}
	s.mu.Unlock()
	if oldest == nil {
		return false
	}
	oldest.cut()
	return true
}

// cutsBefore reports whether lane connection a is to be cut before b (nil: none).
func cutsBefore(a, b *conn) bool {
	if b == nil {
		return true
	}
	if ai, bi := a.inCall.Load(), b.inCall.Load(); ai != bi {
		return ai
	}
	return a.laneAt.Before(b.laneAt)
}

// cut gives the connection's lane slot to the newcomer at once; its hook call, in
// progress or still to come within cutGrace, is answered with the fail-closed deny
// without waiting for the body or the endpoint; after cutGrace it is closed.
func (c *conn) cut() {
	if !c.isCut.CompareAndSwap(false, true) {
		return
	}
	c.release()
	c.cutFn()
	if !c.inCall.Load() {
		c.l.lingering.add(c)
		return
	}
	time.AfterFunc(cutGrace, c.abort)
}

// lingerQueue holds a listener's cut lane connections that had not begun their
// call, each given cutLinger to send it. At maxLingering, the one cut longest
// ago makes room for the newest, closed once its own cutGrace has passed: the
// newest is the likeliest to be a real call (the lane cuts the oldest first),
// and a burst of fake ones cut before it no longer leaves it cutGrace only.
type lingerQueue struct {
	mu sync.Mutex
	q  []*lingerer
}

type lingerer struct {
	c     *conn
	cutAt time.Time
	timer *time.Timer
}

func (lq *lingerQueue) add(c *conn) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if len(lq.q) >= maxLingering {
		old := lq.q[0]
		lq.q = lq.q[1:]
		if old.timer.Stop() {
			time.AfterFunc(time.Until(old.cutAt.Add(cutGrace)), old.c.abort)
		}
	}
	e := &lingerer{c: c, cutAt: time.Now()}
	e.timer = time.AfterFunc(cutLinger, func() { lq.remove(e); c.abort() })
	lq.q = append(lq.q, e)
}

func (lq *lingerQueue) remove(e *lingerer) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if i := slices.Index(lq.q, e); i >= 0 {
		lq.q = slices.Delete(lq.q, i, i+1)
	}
}

var errLaneCut = deny(allowlist.ReasonOverloaded, "hook_lane_cut")

// hookCandidate reports whether the connection's first head may be a pre-tool
// hook call on this listener. It reads without consuming: the head is parsed
// again when the connection is served.
func (c *conn) hookCandidate(rt *Runtime) bool {
	h := rt.Hooks
	if h == nil || h.Index.Len() == 0 || h.ByListener && c.l.cfg.Role != config.RoleHooks {
		return false
	}
	if c.l.cfg.Mode == config.ModeTransparent {
		return c.transparentCandidate(h.Index)
	}
	req := c.peekHead()
	switch {
	case req == nil:
		return false
	case req.Method == http.MethodConnect:
		t, err := allowlist.ParseAuthority(req.RequestURI, 0)
		return err == nil && h.Index.Intercepts(t.Host, t.Port)
	case req.Method != http.MethodPost:
		return false
	}
	t, err := forwardTarget(req)
	return err == nil && isPreHook(h.Index, req.URL.Scheme, t, req)
}

// transparentCandidate: a ClientHello naming a hook host, or a plain POST to a
// pre-tool hook URL.
func (c *conn) transparentCandidate(ix *hooks.Index) bool {
	orig, err := origdst.Get(c.nc)
	if err != nil {
		return false
	}
	first, err := c.br.Peek(1)
	if err != nil {
		return false
	}
	if first[0] == 0x16 {
		hello, err := peekClientHello(&peekReader{br: c.br}) // kept in c.br for serving
		return err == nil && hello.serverName != "" && ix.Intercepts(hello.serverName, orig.Port())
	}
	req := c.peekHead()
	if req == nil || req.Method != http.MethodPost {
		return false
	}
	t, err := transparentTarget(req, orig)
	return err == nil && isPreHook(ix, "http", t, req)
}

func isPreHook(ix *hooks.Index, scheme string, t allowlist.Target, req *http.Request) bool {
	m, ok := ix.Lookup(scheme, t.Host, t.Port, req.URL.EscapedPath())
	return ok && m.Event == hooks.EventPre
}

// peekHead parses the request head at the start of the connection's buffer, or
// returns nil when it does not fit in the buffer or does not parse.
func (c *conn) peekHead() *http.Request {
	for n := 1; ; n = min(c.br.Buffered()+1, c.br.Size()) {
		_, err := c.br.Peek(n) // waits for n bytes; then look at all there are
		b, _ := c.br.Peek(c.br.Buffered())
		if end := bytes.Index(b, []byte("\r\n\r\n")); end >= 0 {
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:end+4])))
			if err != nil {
				return nil
			}
			return req
		}
		if err != nil || n == c.br.Size() {
			return nil
		}
	}
}

// peekReader reads what br has buffered, and waits for more, without consuming
// it; it ends at br's buffer size (a ClientHello larger than that is no candidate).
type peekReader struct {
	br  *bufio.Reader
	off int
}

func (p *peekReader) Read(b []byte) (int, error) {
	if _, err := p.br.Peek(p.off + 1); err != nil && p.br.Buffered() <= p.off {
		return 0, err
	}
	buf, _ := p.br.Peek(p.br.Buffered())
	n := copy(b, buf[p.off:])
	p.off += n
	return n, nil
}

// laneRefusal is the refusal of a request a lane connection may not carry.
func laneRefusal() error { return deny(allowlist.ReasonOverloaded, "hook_lane") }
