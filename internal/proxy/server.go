package proxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/metrics"
)

// Server serves the sandbox-facing listeners. It holds the current Snapshot; Swap
// replaces it atomically and requests already in flight keep the one they started
// with, while open tunnels and upgraded connections are decided again on the new one.
type Server struct {
	snap    atomic.Pointer[Snapshot]
	swapMu  sync.Mutex // one Swap at a time, so the last Snapshot installed decides last
	log     zerolog.Logger
	metrics *metrics.Metrics

	// open holds the spliced tunnels and upgraded connections (redecide.go).
	live openSet

	// hookBuf is the process-wide budget of buffered hook bodies (hookbuf.go),
	// a standing share of mem.
	hookBuf hookBudget
	// mem is the one memory budget (limits.memory) that large request heads,
	// hook bodies and HTTP/2 receive windows draw on (memory.go).
	mem *membudget.Budget
	// nodeConns, in a node-mode sandbox's Server, is the node's
	// limits.max_connections over every sandbox's listeners: each connection
	// holds one (NewShare). shareConns is that count in the node's own Server.
	nodeConns, shareConns *membudget.Budget

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
		mem: membudget.New(0), shareConns: membudget.New(int64(snap.Limits.MaxConnections))}
	s.setMemory(snap)
	s.snap.Store(snap)
	if snap.Sandbox == "" {
		// The process's budget: in node mode, every sandbox's share reserves
		// from it too, so the gauge shows the node's totals.
		m.ObserveMemory(s.mem, s.hookBuf.used.Load)
	}
	s.initRules(snap)
	return s
}

// NewShare returns the Server of one node-mode sandbox: its memory budget and
// hook buffer (snap.Limits.Memory and HookBufferBytes, the sandbox's share) are
// shares of node's, reserving from them too, and each of its connections takes
// one of node's limits.max_connections, so that the node's totals stay bounded
// and no sandbox can spend what its share does not hold (docs/node.md).
func NewShare(node *Server, snap *Snapshot, log zerolog.Logger, m *metrics.Metrics) *Server {
	s := &Server{log: log, metrics: m, conns: map[*conn]struct{}{}, lns: map[net.Listener]struct{}{},
		mem: node.mem.Share(0), nodeConns: node.shareConns}
	s.hookBuf.parent, s.hookBuf.key = &node.hookBuf, snap.Sandbox
	s.setMemory(snap)
	s.snap.Store(snap)
	s.initRules(snap)
	return s
}

// Budget is the Server's memory budget, for showing what it holds.
func (s *Server) Budget() *membudget.Budget { return s.mem }

// HookBuffered is the bytes of hook bodies the Server holds buffered.
func (s *Server) HookBuffered() int64 { return s.hookBuf.used.Load() }

// Snapshot returns the Snapshot new requests are served with.
func (s *Server) Snapshot() *Snapshot { return s.snap.Load() }

// Swap installs snap for new requests, decides every open tunnel and upgraded
// connection again on it, ends those it refuses (redecide.go), and returns the
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
// lane: slots beyond the bound that only pre-tool hook calls may take (lane.go).
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
	// being admitted (the ones a newcomer may evict: slots.go), and lanes its
	// lane connections not yet cut (lane.go); guarded by Server.mu, so that
	// neither an eviction nor a cut scans every connection a flood holds.
	bySlot map[slotKind]map[*conn]struct{}
	lanes  map[*conn]struct{}
}

// Serve accepts connections on ln until Shutdown. Beyond limits.max_connections
// concurrent connections, a new connection takes the slot of the one that has
// waited longest for its client (slots.go), or is answered 503 and closed when
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
// budget (connmem.go); when either is lacking, nc is one beyond the bound.
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
// back and nc admitted as a connection beyond the bound (lane.go), refused
// overloaded unless it is a pre-tool hook call.
func (s *Server) serveConn(l *listener, nc net.Conn) {
	m, refused := s.reserveConn(l)
	if refused != "" {
		<-l.sem
		l.overflow.Add(1)
		go s.admit(l, nc, refused)
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
