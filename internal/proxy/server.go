package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/origdst"
)

// Admission: a connection is served only with a slot of its listener (the longest
// waiting connection evicted to make one), or a slot of the hook lane for a
// pre-tool hook call, and with its cost held in the memory budget; every read and
// write it makes has a deadline. Below Server, in that order: slots, the hook lane,
// the memory a connection holds and the budget's shares, deadlines.

// Server serves the sandbox-facing listeners. It holds the current Snapshot; Swap
// replaces it atomically and requests already in flight keep the one they started
// with, while open tunnels and upgraded connections are decided again on the new one.
type Server struct {
	snap    atomic.Pointer[Snapshot]
	swapMu  sync.Mutex // one Swap at a time, so the last Snapshot installed decides last
	log     zerolog.Logger
	metrics *metrics.Metrics

	// open holds the spliced tunnels and upgraded connections (tunnel.go).
	live openSet

	// hookBuf is the process-wide budget of buffered hook bodies (hookcall.go),
	// a standing share of mem.
	hookBuf hookBudget
	// mem is the one memory budget (limits.memory) that large request heads,
	// hook bodies and HTTP/2 receive windows draw on.
	mem *membudget.Budget

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*conn]struct{}
	lns     map[net.Listener]struct{}
	// tally counts the records of every listener (Tally).
	tally Tally
	// reflected holds the (rule, credential) pairs an upstream has been seen
	// reflecting, so each is warned about once (scrub.go).
	reflected sync.Map
}

// New returns a Server that serves with snap.
func New(snap *Snapshot, log zerolog.Logger, m *metrics.Metrics) *Server {
	s := &Server{log: log, metrics: m, conns: map[*conn]struct{}{}, lns: map[net.Listener]struct{}{},
		mem: membudget.New(0)}
	s.setMemory(snap)
	s.snap.Store(snap)
	if snap.Sandbox == "" {
		// The process's budget; a node-mode sandbox's Server has one of its own,
		// which the gauge does not show.
		m.ObserveMemory(s.mem, s.hookBuf.used.Load)
	}
	s.initRules(snap)
	return s
}

// Snapshot returns the Snapshot new requests are served with.
func (s *Server) Snapshot() *Snapshot { return s.snap.Load() }

// Swap installs snap for new requests, decides every open tunnel and upgraded
// connection again on it, ends those it refuses (tunnel.go), and returns the
// previous Snapshot.
func (s *Server) Swap(snap *Snapshot) *Snapshot {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.setMemory(snap)
	s.initRules(snap)
	old := s.snap.Swap(snap)
	if open, ended := s.redecide(snap); ended > 0 {
		s.log.Info().Int("open", open).Int("closed", ended).
			Msg("open connections the new policy refuses were closed")
	}
	return old
}

// initRules exports scrubbed_total for snap's rules that inject.
func (s *Server) initRules(snap *Snapshot) {
	if snap == nil || snap.Policy == nil {
		return
	}
	var names []string
	for _, r := range snap.Policy.Rules() {
		if r.Injects() {
			names = append(names, r.Pattern)
		}
	}
	s.metrics.InitRules(names)
}

// listener is one configured listener with its connection bound, and the hook
// lane: slots beyond the bound that only pre-tool hook calls may take.
type listener struct {
	cfg     config.Listener
	sandbox string // Snapshot.Sandbox, fixed for the Server
	tally   *Tally
	sem     chan struct{}
	lane    chan struct{}
	// overflow counts the connections accepted beyond the bound (being
	// admitted, in the lane, cut); at maxOverflow the accept loop waits
	// (awaitRoom).
	overflow    atomic.Int64
	maxOverflow int64
	// bySlot holds the listener's connections holding a main slot and those
	// being admitted (the ones a newcomer may evict), and lanes its
	// lane connections not yet cut; guarded by Server.mu, so that
	// neither an eviction nor a cut scans every connection a flood holds.
	bySlot map[slotKind]map[*conn]struct{}
	lanes  map[*conn]struct{}
}

// Serve accepts connections on ln until Shutdown. Beyond limits.max_connections
// concurrent connections, a new connection takes the slot of the one that has
// waited longest for its client, or is answered 503 and closed when
// every connection is serving.
func (s *Server) Serve(ln net.Listener, cfg config.Listener) error {
	if !s.trackListener(ln, true) {
		return nil
	}
	defer s.trackListener(ln, false)
	l := &listener{cfg: cfg, sandbox: s.Snapshot().Sandbox, tally: &s.tally, sem: make(chan struct{}, s.Snapshot().Limits.MaxConnections), lane: make(chan struct{}, hookLane),
		maxOverflow: overflowBound(), lanes: map[*conn]struct{}{},
		bySlot: map[slotKind]map[*conn]struct{}{slotMain: {}, slotAdmit: {}}}
	s.InitMetrics(cfg)
	var backoff time.Duration
	for {
		s.awaitRoom(l)
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Str("listener", cfg.Name).Msg("accept failed; retrying")
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(l, nc)
	}
}

// InitMetrics exports the zero-valued series of a listener; Serve calls it too, and
// callers that must have them before the first scrape call it before Serve.
func (s *Server) InitMetrics(cfg config.Listener) {
	s.metrics.InitListener(cfg.Name)
}

// accept serves nc in a free slot of l with its cost reserved from the memory
// budget; when either is lacking, nc is one beyond the bound.
func (s *Server) accept(l *listener, nc net.Conn) {
	select {
	case l.sem <- struct{}{}:
		s.serveConn(l, nc)
	default:
		l.overflow.Add(1)
		go s.acceptOverloaded(l, nc)
	}
}

// serveConn serves nc, which holds one of l's slots, on a goroutine of its own,
// once its cost is reserved; when the budget cannot grant it, the slot is given
// back and nc admitted as a connection beyond the bound, refused
// overloaded unless it is a pre-tool hook call.
func (s *Server) serveConn(l *listener, nc net.Conn) {
	m, ok := s.reserveConn(l)
	if !ok {
		<-l.sem
		l.overflow.Add(1)
		go s.admit(l, nc, membudget.Conns.Detail())
		return
	}
	c := newConn(s, l, nc)
	c.mem = m
	s.serveIn(c, l.sem)
}

// serveIn serves c, which holds a slot of sem, on a goroutine of its own.
func (s *Server) serveIn(c *conn, sem chan struct{}) {
	l := c.l
	c.release = sync.OnceFunc(func() { <-sem })
	if !s.trackConn(c, true) {
		c.release()
		c.nc.Close()
		c.ended()
		return
	}
	go func() {
		defer c.ended()
		defer c.release()
		defer s.trackConn(c, false)
		if l.cfg.Mode == config.ModeTransparent {
			c.serveTransparent()
			return
		}
		c.serve()
	}()
}

func (s *Server) trackListener(ln net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closing.Load() {
			return false
		}
		s.lns[ln] = struct{}{}
	} else {
		delete(s.lns, ln)
	}
	return true
}

func (s *Server) trackConn(c *conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		if s.closing.Load() {
			return false
		}
		s.conns[c] = struct{}{}
		if byKind := c.l.bySlot[c.slot]; byKind != nil {
			byKind[c] = struct{}{}
		}
		if c.slot == slotLane && c.laneRoot == c && !c.isCut.Load() {
			c.l.lanes[c] = struct{}{}
		}
	} else {
		delete(s.conns, c)
		delete(c.l.bySlot[c.slot], c)
		delete(c.l.lanes, c)
	}
	return true
}

// Shutdown stops accepting, closes idle keep-alive connections, and lets requests
// in flight finish until ctx ends (limits.drain). Then it closes what is left —
// tunnels and WebSockets, which have no end to wait for, and requests past the
// drain — and waits up to closeWait for their goroutines, so that every record is
// logged before the process exits. The error is ctx's when requests were cut.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	for ln := range s.lns {
		ln.Close()
	}
	s.mu.Unlock()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var err error
	for s.closeIdle() > 0 && err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-tick.C:
		}
	}
	s.closeAll()
	for wait := time.Now().Add(closeWait); s.open() > 0 && time.Now().Before(wait); {
		<-tick.C
	}
	return err
}

// closeWait bounds how long Shutdown waits for closed connections to log and end.
const closeWait = time.Second

// closeIdle wakes connections waiting for their next request and returns how many
// requests are still in flight: on connections that are neither idle nor a tunnel,
// WebSocket or intercepted HTTP/2 connection without a stream in flight.
func (s *Server) closeIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := 0
	for c := range s.conns {
		switch {
		case c.idle.Load() || c.slot == slotAdmit:
			c.nc.SetReadDeadline(time.Now())
		case !c.tunneling.Load() || c.streams.Load() > 0:
			busy++
		}
	}
	return busy
}

// Tally is the Server's count of records by decision.
func (s *Server) Tally() *Tally { return &s.tally }

// Open is the number of connections the Server holds open.
func (s *Server) Open() int { return s.open() }

func (s *Server) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.abort()
	}
}

// A listener at limits.max_connections gives a new connection the slot of the
// connection that has waited longest for its client, at least evictAfter: an
// idle keep-alive connection, or one still sending a request head or
// ClientHello. A slow client (slowloris) can therefore hold connection slots
// only while nobody else needs them; the newcomer gets 503 overloaded only when
// every connection is serving or began its wait within evictAfter. Requests,
// tunnels and upstream waits are never evicted. When no waiting
// connection can make room, a pre-tool hook call may still take a slot of the
// listener's hook lane; everything else gets 503.

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

// The hook lane keeps a pre-tool hook call answered when the sandbox holds every
// connection slot (slow bodies, clients that never read, held tunnels; docs/hooks.md
// "Hooks"). The runtime reads a 503 or a reset as "allow", so at
// limits.max_connections, with no waiting connection to evict, a
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

// A client connection draws on the memory budget for what it holds (holder
// Conns, sized by membudget's costs.go): its own cost when it is accepted, a
// tunnel's when it carries one (until it ends), a request's while the request is
// served. When the budget cannot grant it, the newest is refused: at accept the
// connection is admitted as one beyond the listener's bound (a pre-tool
// hook call takes the hook lane, anything else gets 503 overloaded, detail
// memory_conns), a CONNECT or request gets 503 overloaded in place of its answer,
// so what is already held keeps working and no flood of held connections can push
// egressd into an OOM kill.
//
// The runtime is never refused for memory: a hooks listener's connections, and
// a pre-tool hook call (or a CONNECT to a hook host) the listener may carry, take
// their cost even past the limit (Budget.Take), so the sandbox's connections are
// refused sooner instead. Connections beyond the listener's bound (being
// admitted, in the hook lane, cut) reserve nothing: the overflow bound
// counts them at their cost apart from the budget.

// errConnMemory refuses a connection, tunnel or request the budget cannot hold.
var errConnMemory = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Conns.Detail(),
	Err: errors.New("limits.memory reached: too many connections held open at once")}

// connMem is what one client connection holds of the budget; an intercepted
// tunnel's inner connection shares its outer one's.
type connMem struct {
	mem     *membudget.Budget // nil: counted elsewhere (beyond the listener's bound)
	runtime bool              // a hooks listener's: never refused
	held    atomic.Int64
}

// reserveConn reserves a new connection's cost on l, or reports false.
func (s *Server) reserveConn(l *listener) (*connMem, bool) {
	m := &connMem{mem: s.mem, runtime: l.cfg.Role == config.RoleHooks}
	return m, m.grow(membudget.ConnCost, false)
}

// grow adds n bytes to what the connection holds, or reports false when the
// budget cannot grant them and neither the connection nor the request (hook) is
// the runtime's.
func (m *connMem) grow(n int64, hook bool) bool {
	if m.runtime || hook {
		m.mem.Take(membudget.Conns, n)
	} else if !m.mem.Reserve(membudget.Conns, n) {
		return false
	}
	m.held.Add(n)
	return true
}

// shrink gives back n bytes grow added.
func (m *connMem) shrink(n int64) {
	m.held.Add(-n)
	m.mem.Release(membudget.Conns, n)
}

// release gives back everything the connection holds, once it has ended.
func (m *connMem) release() {
	if n := m.held.Swap(0); n > 0 {
		m.mem.Release(membudget.Conns, n)
	}
}

// holdFor reserves what req adds to the connection while it is served: a
// tunnel's cost for a CONNECT (kept until the connection ends: a tunnel is its
// last use), a request's otherwise (given back by the returned func). A pre-tool
// hook call is never refused (the runtime reads a refusal as "allow").
func (c *conn) holdFor(snap *Snapshot, req *http.Request) (done func(), ok bool) {
	if c.route.mode == modeExplicit && req.Method == http.MethodConnect {
		return func() {}, c.mem.grow(membudget.TunnelCost, c.hookConnect(snap, req))
	}
	if !c.mem.grow(membudget.RequestCost, c.hookRequest(snap, req)) {
		return func() {}, false
	}
	return func() { c.mem.shrink(membudget.RequestCost) }, true
}

// holdTransparentTunnel reserves a tunnel's cost for an intercepted TLS
// connection on a transparent listener (a CONNECT reserved its own in handle),
// and reports false when the budget cannot hold it. A connection to a hook host
// from a listener whose traffic may be hook traffic is never refused.
func (c *conn) holdTransparentTunnel(snap *Snapshot, t allowlist.Target) bool {
	if c.route.mode != modeTransparent {
		return true
	}
	h := snap.Hooks
	hook := h != nil && h.Index.Len() > 0 && h.callIdent(c.l.cfg.Role, "") != "" && h.Index.Intercepts(t.Host, t.Port)
	return c.mem.grow(membudget.TunnelCost, hook)
}

// hookConnect reports whether req, a CONNECT, may carry the runtime's pre-tool
// hook calls: it names a hook host, from a listener or with an identity whose
// traffic is hook traffic.
func (c *conn) hookConnect(snap *Snapshot, req *http.Request) bool {
	h := snap.Hooks
	if h == nil || h.Index.Len() == 0 || h.callIdent(c.l.cfg.Role, h.authIdent(req.Header)) == "" {
		return false
	}
	t, err := allowlist.ParseAuthority(req.RequestURI, 0)
	return err == nil && h.Index.Intercepts(t.Host, t.Port)
}

// hookRequest reports whether req is a pre-tool hook call on this connection:
// a POST to a pre-tool hook URL, from a listener or with an identity (the
// request's, or its tunnel's CONNECT's) whose traffic is hook traffic.
func (c *conn) hookRequest(snap *Snapshot, req *http.Request) bool {
	h := snap.Hooks
	if h == nil || h.Index.Len() == 0 || req.Method != http.MethodPost {
		return false
	}
	if h.callIdent(c.l.cfg.Role, cmp.Or(h.authIdent(req.Header), c.authIdent)) == "" {
		return false
	}
	switch {
	case c.route.inTunnel():
		return isPreHook(h.Index, map[bool]string{false: "https", true: "http"}[c.route.plain], c.route.target, req)
	case c.route.mode == modeTransparent:
		t, err := transparentTarget(req, c.route.orig)
		return err == nil && isPreHook(h.Index, "http", t, req)
	}
	t, err := forwardTarget(req)
	return err == nil && isPreHook(h.Index, req.URL.Scheme, t, req)
}

// setMemory sizes the memory budget for snap (limits.memory; auto is resolved again,
// so a reload follows a changed cgroup limit) and divides it:
//   - hook bodies get a standing share, limits.hook_buffer_bytes, at most half the
//     budget (but one hook body always): set aside, so that no flood of heads or
//     HTTP/2 windows can take the memory a hook call's body needs;
//   - large request heads may take at most an eighth (8 MiB at the shipped
//     256 MiB limit: 128 heads of 64 KiB, a thousand of 5 KiB): honest heads
//     beyond the connection's 4 KiB buffer are rare, and each held connection
//     also costs its goroutine and buffers outside the budget, so heads held
//     open by the thousand must leave room for those;
//   - HTTP/2 receive windows take what is left.
func (s *Server) setMemory(snap *Snapshot) {
	limit, _ := membudget.Resolve(snap.Limits.Memory)
	s.mem.SetLimit(limit)
	share := membudget.HookShare(limit, snap.Limits.HookBufferBytes, snap.Limits.HookBodyBytes)
	s.mem.SetAside(membudget.HookBodies, share)
	s.hookBuf.limit.Store(share)
	s.mem.SetCap(membudget.Heads, limit/8)
	snap.mem = s.mem
}

// The upstream HTTP/2 Transport's receive windows: how much of an upstream's
// response it buffers before egressd has read it. Go's defaults (4 MiB a stream,
// 1 GiB a connection) let one client that reads nothing, with a few streams,
// make egressd buffer hundreds of MiB of an upstream's data; these bound one
// connection to about a megabyte. A stream still moves 256 KiB per round trip, a
// few MiB/s at ordinary latencies.
const (
	upstreamStreamWindow = 256 << 10
	upstreamConnWindow   = 1 << 20
)

// errH2Windows refuses a request or stream whose HTTP/2 window the budget cannot hold.
var errH2Windows = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.H2Windows.Detail(),
	Err: errors.New("limits.memory reached: too many HTTP/2 receive windows held at once")}

// holdUpstreamWindow reserves a stream's window for a request the upstream client
// sends on its HTTP/2 transport (upstream.Options.HoldWindow), until the response
// body ends. Hook calls reserve none: egressd reads their answers itself, from the
// hook share (hookcall.go), so a flood of other holders cannot deny them.
func (snap *Snapshot) holdUpstreamWindow(ctx context.Context) (release func(), err error) {
	if isHookCall(ctx) {
		return nil, nil
	}
	if !snap.mem.Reserve(membudget.H2Windows, upstreamStreamWindow) {
		return nil, errH2Windows
	}
	mem := snap.mem
	return func() { mem.Release(membudget.H2Windows, upstreamStreamWindow) }, nil
}

// holdStreamWindow reserves what an intercepted HTTP/2 client may send on r's
// stream before egressd reads it: its body's declared length, at most the stream's
// window (h2StreamWindow); nothing for a stream without a body. A connection
// buffers at most its window (h2ConnWindow) over all its streams, so what the
// streams reserve bounds it, and idle connections cost the budget nothing. It
// reports false, reserving nothing, when the budget cannot hold it; release gives
// it back.
func holdStreamWindow(mem *membudget.Budget, r *http.Request) (release func(), ok bool) {
	n := int64(h2StreamWindow)
	if r.ContentLength >= 0 {
		n = min(n, r.ContentLength)
	}
	if !mem.Reserve(membudget.H2Windows, n) {
		return func() {}, false
	}
	return func() { mem.Release(membudget.H2Windows, n) }, true
}

// Every read from and write to a client has a deadline, so that no client can hold
// a connection slot, a goroutine or a buffer by going quiet (docs/hooks.md: the
// paragraph on attacks):
//
//   - request heads: limits.read_header (conn.nextRequest);
//   - request bodies: limits.read_header per read, HTTP/1 and HTTP/2 alike, until
//     they are forwarded, then limits.stream_idle; a hook call's whole body: the
//     hook's own deadline (bodyDeadline, pipeline.go);
//   - upgraded connections: limits.stream_idle without a byte either way (idleWatch);
//   - writes: limits.client_write per write (clientWriter, conn.go), HTTP/2 included
//     (http.HTTP2Config.WriteByteTimeout), tunnels and upgrades too.

// idleWatch ends an upgraded connection once neither direction has moved a byte
// for d: one timer, re-armed for what is left of d whenever it fires early, and a
// timestamp each read with data moves forward.
type idleWatch struct {
	last  atomic.Int64 // UnixNano of the last byte either way
	d     time.Duration
	timer *time.Timer
}

func watchIdle(d time.Duration, end func()) *idleWatch {
	w := &idleWatch{d: d}
	w.last.Store(time.Now().UnixNano())
	w.timer = time.AfterFunc(math.MaxInt64, func() { // armed below, once w.timer is set
		if left := d - time.Since(time.Unix(0, w.last.Load())); left > 0 {
			w.timer.Reset(left)
			return
		}
		end()
	})
	w.timer.Reset(d)
	return w
}

func (w *idleWatch) stop() { w.timer.Stop() }

// reader is r, marking w active on every read that returns data.
func (w *idleWatch) reader(r io.Reader) io.Reader { return activityReader{r, w} }

type activityReader struct {
	r io.Reader
	w *idleWatch
}

func (a activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.w.last.Store(time.Now().UnixNano())
	}
	return n, err
}
