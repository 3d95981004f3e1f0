package proxy

import (
	"cmp"
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/membudget"
)

// A client connection draws on the memory budget for what it holds (holder
// Conns, sized by membudget's costs.go): its own cost when it is accepted, a
// tunnel's when it carries one (until it ends), a request's while the request is
// served. When the budget cannot grant it, the newest is refused: at accept the
// connection is admitted as one beyond the listener's bound (lane.go: a pre-tool
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
// (slots.go) counts them at their cost apart from the budget.

// errConnMemory refuses a connection, tunnel or request the budget cannot hold.
var errConnMemory = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Conns.Detail(),
	Err: errors.New("limits.memory reached: too many connections held open at once")}

// connMem is what one client connection holds of the budget; an intercepted
// tunnel's inner connection shares its outer one's.
type connMem struct {
	mem     *membudget.Budget // nil: counted elsewhere (beyond the listener's bound)
	runtime bool              // a hooks listener's: never refused
	held    atomic.Int64
	// node is the node's connection count this connection holds one of
	// (Server.nodeConns); nil outside node mode, or once given back.
	node atomic.Pointer[membudget.Budget]
}

// detailNodeConns refuses a sandbox's connection when the node's
// limits.max_connections, over every sandbox, is spent.
const detailNodeConns = "node_max_connections"

// reserveConn reserves a new connection's cost on l (and, in node mode, one of
// the node's connections), or returns the refusal's detail.
func (s *Server) reserveConn(l *listener) (*connMem, string) {
	m := &connMem{mem: s.mem, runtime: l.cfg.Role == config.RoleHooks}
	if s.nodeConns != nil {
		if m.runtime {
			s.nodeConns.Take(membudget.Conns, 1)
		} else if !s.nodeConns.Reserve(membudget.Conns, 1) {
			return m, detailNodeConns
		}
		m.node.Store(s.nodeConns)
	}
	if d := m.mem.TryReserve(membudget.Conns, membudget.ConnCost); d != "" && !m.runtime {
		m.release()
		return m, d
	} else if d != "" {
		m.mem.Take(membudget.Conns, membudget.ConnCost)
	}
	m.held.Add(membudget.ConnCost)
	return m, ""
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
	if node := m.node.Swap(nil); node != nil {
		node.Release(membudget.Conns, 1)
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
