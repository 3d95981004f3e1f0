package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/origdst"
)

// The hook lane keeps a pre-tool hook call answered when the sandbox holds every
// connection slot (slow bodies, clients that never read, held tunnels; docs/hooks.md
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
//
// A connection egressd has accepted is never closed without an answer and an
// egress line (reason overloaded, a detail naming the path; recordClose): the
// runtime reads a close as "allow". What bounds the connections held beyond
// limits.max_connections is the listener's accept loop instead (awaitRoom): at
// maxOverflow, newer connections wait in the kernel's backlog, unaccepted.
const (
	hookLane  = 32                     // lane slots per listener
	admitHead = 2 * time.Second        // the newcomer's first head must arrive within this
	laneWait  = 500 * time.Millisecond // a newcomer waits this long for a cut connection's slot
	cutGrace  = time.Second            // a cut connection in a call is closed after this, answered or not
	// Connections being admitted at once: beyond maxAdmitting, the oldest that
	// has waited evictAfter for its head is answered 503 and closed (a younger
	// one may be a real call whose head is on the way, and is never cut).
	maxAdmitting = 64
	// A cut connection that has not begun its call yet (still in its TLS
	// handshake, or sending its head: under load, a real call's) may take up to
	// cutLinger to send it and get the deny, rather than a close the runtime
	// would read as allow. It holds no slot; maxOverflow bounds how many there
	// are.
	cutLinger = 5 * time.Second
)

// Details of the egress lines of connections egressd closes.
const (
	detailAdmitEvicted = "admission_evicted" // beyond maxAdmitting, its head not sent within evictAfter
	detailLaneCut      = "hook_lane_cut"     // cut from the hook lane (its call gets the deny)
	detailLaneLinger   = "hook_lane_linger"  // cut, and its call not sent within cutLinger
)

// slotKind is what a connection holds.
type slotKind uint8

const (
	slotMain  slotKind = iota // one of limits.max_connections
	slotAdmit                 // none: being admitted to the lane
	slotLane                  // one of hookLane
)

// admit reads nc's first head and serves a pre-tool hook call in the lane, or
// answers anything else 503 overloaded, with detail saying why it came here
// ("": every slot was serving). nc holds one of l's overflow places
// (awaitRoom), given back when the connection ends.
func (s *Server) admit(l *listener, nc net.Conn, detail string) {
	snap := s.Snapshot()
	c := newConn(s, l, nc)
	c.slot = slotAdmit
	c.onEnd = sync.OnceFunc(func() { l.overflow.Add(-1) })
	if !s.trackConn(c, true) { // shutting down
		nc.Close()
		c.ended()
		return
	}
	if s.admitting(l) > maxAdmitting {
		s.evictWaiting(l, slotAdmit, evictAfter)
	}
	c.waitFor(admitHead)
	candidate := c.hookCandidate(snap)
	evicted := !c.waited()
	s.trackConn(c, false)
	switch {
	case evicted:
		c.rejectOverloaded(detailAdmitEvicted)
	case !candidate:
		c.rejectOverloaded(detail)
	default:
		s.serveLane(l, c, snap)
		return
	}
	c.ended()
}

// admitting counts l's connections being admitted.
func (s *Server) admitting(l *listener) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(l.bySlot[slotAdmit])
}

// serveLane serves c in a lane slot, cutting the oldest lane connection when
// the lane is full. When no slot comes within laneWait (newcomers took the one
// it freed), c is served cut from the start, holding no slot: its call gets the
// deny within cutLinger, as a cut connection's does, rather than a close before
// it could send it.
func (s *Server) serveLane(l *listener, c *conn, snap *Snapshot) {
	sem := l.lane
	if !takeSlot(l.lane, 0) && !(s.cutOldestLane(l) && takeSlot(l.lane, laneWait)) {
		sem = make(chan struct{}, 1) // a slot of its own, given back by the cut
		sem <- struct{}{}
	}
	c.slot, c.lane, c.laneAt = slotLane, true, time.Now()
	c.cutCtx, c.cutFn = context.WithCancel(context.Background())
	c.laneRoot = c
	c.lifeTimer = time.AfterFunc(laneLife(snap), c.cut)
	s.serveIn(c, sem)
	if sem != l.lane {
		c.cut()
	}
}

// laneLife bounds a lane connection: its TLS handshake and head, then the longest
// hook deadline, then a second to write the answer.
func laneLife(snap *Snapshot) time.Duration {
	longest := time.Duration(0)
	for _, m := range snap.Hooks.Index.Matches() {
		longest = max(longest, hooks.Deadline(m.Timeout))
	}
	return 2*snap.Limits.ReadHeader + longest + time.Second
}

// cutOldestLane cuts one of l's lane connections and reports whether there was
// one: the oldest of those already in a hook call (a body trickling in, an
// endpoint slow to answer: the call is answered with the deny at once), else the
// oldest. A real call that is still in its handshake is the newest arrival, and
// the last to be cut.
func (s *Server) cutOldestLane(l *listener) bool {
	s.mu.Lock()
	var oldest *conn
	for c := range l.lanes {
		if cutsBefore(c, oldest) {
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
// progress or still to come, is answered with the fail-closed deny without
// waiting for the body or the endpoint. A connection in its call is closed after
// cutGrace whatever it does; one that has not begun it yet has cutLinger to send
// it (the newest arrival is the likeliest real call, and the lane cuts the oldest
// first, so a real call is often cut mid-handshake).
func (c *conn) cut() {
	if !c.isCut.CompareAndSwap(false, true) {
		return
	}
	c.closedFor.CompareAndSwap(nil, &detailLaneCutValue)
	c.s.mu.Lock()
	delete(c.l.lanes, c)
	c.s.mu.Unlock()
	c.release()
	c.cutFn()
	wait, detail := cutLinger, detailLaneLinger
	if c.inCall.Load() {
		wait, detail = cutGrace, detailLaneCut
	}
	c.cutTimer.Store(time.AfterFunc(wait, func() { c.closeFor(detail) }))
}

// detailLaneCutValue is detailLaneCut, addressable for closedFor.
var detailLaneCutValue = detailLaneCut

// closeFor closes the connection for the reason its egress line names.
func (c *conn) closeFor(detail string) {
	c.closedFor.Store(&detail)
	c.abort()
}

// recordClose makes the record of a connection egressd cut or closed say so:
// reason overloaded, the detail naming the path. Records of requests inside an
// intercepted tunnel say what happened to them; the tunnel's says why it ended.
func (c *conn) recordClose(rec *Record) {
	d := c.closedFor.Load()
	if d == nil || c.laneRoot != c || rec.Reason == allowlist.ReasonOverloaded {
		return
	}
	rec.Reason, rec.Detail = allowlist.ReasonOverloaded, *d
}

var errLaneCut = deny(allowlist.ReasonOverloaded, "hook_lane_cut")

// hookCandidate reports whether the connection's first head may be a pre-tool
// hook call on this listener. It reads without consuming: the head is parsed
// again when the connection is served.
func (c *conn) hookCandidate(snap *Snapshot) bool {
	h := snap.Hooks
	if h == nil || h.Index.Len() == 0 {
		return false
	}
	if c.l.cfg.Mode == config.ModeTransparent {
		return h.callIdent(c.l.cfg.Role, "") != "" && c.transparentCandidate(h.Index)
	}
	req := c.peekHead()
	switch {
	case req == nil || h.callIdent(c.l.cfg.Role, h.authIdent(req.Header)) == "":
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
