package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

var errTooManyFiles = syscall.EMFILE

// conn is one sandbox connection on an explicit proxy listener: a loop of requests,
// ended by a CONNECT tunnel, a refusal that leaves the framing in doubt, the client,
// an idle timeout or shutdown.
type conn struct {
	s    *Server
	l    *listener
	nc   net.Conn
	head headReader
	br   *bufio.Reader
	bw   *bufio.Writer
	idle atomic.Bool // waiting for the next request; Shutdown may close it
	// slot is what the connection holds: a main slot, none yet (being admitted
	// to the hook lane), or a lane slot; lane restricts it to pre-tool hook calls
	// (server.go). Inner connections of an intercepted tunnel share the outer's.
	slot   slotKind
	lane   bool
	laneAt time.Time // when an outer lane connection took its slot
	isCut  atomic.Bool
	// cutCtx ends when a lane connection is cut (server.go): a hook call on it then
	// gets the deny at once. Nil outside the lane.
	cutCtx context.Context
	cutFn  context.CancelFunc
	// laneRoot is the outer lane connection (itself, or the one an intercepted
	// inner connection runs in); inCall is set on it once a hook call has begun.
	laneRoot *conn
	inCall   atomic.Bool
	// closedFor is set on an outer connection egressd cuts or closes: the detail
	// its egress line gives (recordClose); lifeTimer cuts a lane connection at
	// the end of its life, cutTimer closes a cut one. Both are stopped when the
	// connection ends: a pending timer keeps the connection and its buffers.
	closedFor atomic.Pointer[string]
	lifeTimer *time.Timer
	cutTimer  atomic.Pointer[time.Timer]
	// release gives the connection's slot back (once; serveIn); onEnd, when set,
	// gives back its place beyond the listener's bound (awaitRoom) once the
	// connection has ended (ended).
	release func()
	onEnd   func()
	// tunneling is set once the connection carries bytes egressd does not frame
	// (a tunnel, an upgrade) or is the outside of an intercepted tunnel, whose
	// requests are counted on the inner connection, or in streams for HTTP/2.
	// Shutdown closes such connections without waiting for them.
	tunneling atomic.Bool
	streams   atomic.Int32
	// waitSince is when the connection began waiting for the client (a request head
	// or a ClientHello), in Unix nanoseconds; 0 while it is serving, evicted once
	// an overloaded listener has taken its slot (server.go).
	waitSince atomic.Int64
	// hookKeepAlive is set while the connection's last request was a pre-tool hook
	// call: waiting for its next request, it is never evicted (server.go).
	hookKeepAlive atomic.Bool

	// mem is what the connection holds of the memory budget (server.go).
	mem *connMem

	// route is the connection's mode (mode.go), fixed before its first request.
	route route
	// requests counts the requests the connection has carried.
	requests int
	// authIdent is what the tunnel's CONNECT presented as Proxy-Authorization
	// under hooks.identify runtime_auth (identify.go); inner connections and
	// HTTP/2 streams inherit it.
	authIdent string

	ctx    context.Context
	cancel context.CancelFunc
}

func newConn(s *Server, l *listener, nc net.Conn) *conn {
	c := &conn{s: s, l: l, nc: nc, mem: &connMem{}}
	c.head = headReader{r: nc}
	c.br = bufio.NewReaderSize(&c.head, headChunk)
	c.bw = bufio.NewWriterSize(&clientWriter{Conn: nc, d: s.Snapshot().Limits.ClientWrite}, 4096)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// ended runs once the connection has been closed for good.
func (c *conn) ended() {
	if c.lifeTimer != nil {
		c.lifeTimer.Stop()
	}
	if t := c.cutTimer.Load(); t != nil {
		t.Stop()
	}
	c.mem.release()
	if c.onEnd != nil {
		c.onEnd()
	}
}

// abort ends the connection and everything it is waiting on.
func (c *conn) abort() {
	c.cancel()
	c.nc.Close()
}

func (c *conn) serve() {
	defer c.abort()
	defer c.recoverPanic()
	c.serveLoop()
}

// serveLoop reads and serves requests until the connection is done.
func (c *conn) serveLoop() {
	for c.nextRequest() {
		snap := c.s.Snapshot()
		req, err := readRequest(c.br, &c.head, snap.Limits.MaxHeaderBytes, c.s.mem)
		if !c.waited() {
			c.closeEvicted(snap)
			return
		}
		if err != nil {
			c.refuseHead(snap, req, err)
			return
		}
		if !c.handle(snap, req) || c.s.closing.Load() {
			return
		}
	}
}

// nextRequest waits up to limits.client_idle for the first byte of the next request,
// then gives the client limits.read_header to send the whole head.
func (c *conn) nextRequest() bool {
	snap := c.s.Snapshot()
	c.idle.Store(true)
	defer c.idle.Store(false)
	if c.s.closing.Load() {
		return false
	}
	c.waitFor(snap.Limits.ClientIdle)
	if _, err := c.br.Peek(1); err != nil {
		if c.waitSince.Load() == evicted {
			c.closeEvicted(snap)
		}
		return false
	}
	c.nc.SetReadDeadline(time.Now().Add(snap.Limits.ReadHeader))
	// An eviction between the Peek and the line above had its deadline overwritten.
	return c.waitSince.Load() != evicted
}

func (c *conn) recoverPanic() {
	if v := recover(); v != nil {
		c.s.log.Error().Str("listener", c.l.cfg.Name).Str("panic", fmt.Sprint(v)).
			Bytes("stack", debug.Stack()).Msg("panic serving connection; connection closed")
	}
}

// handle serves one request and reports whether the connection may carry another.
func (c *conn) handle(snap *Snapshot, req *http.Request) bool {
	rec := newRecord(c.l, c.nc.RemoteAddr())
	rec.Method = req.Method
	defer rec.finish(&c.s.log, c.s.metrics)
	defer c.recordClose(rec)
	c.requests++
	done, ok := c.holdFor(snap, req)
	if !ok {
		return c.refuseAndClose(snap, rec, errConnMemory)
	}
	defer done()
	if c.route.mode == modeExplicit && req.Method == http.MethodConnect {
		return c.serveConnect(snap, req, rec)
	}
	return c.serveHTTP1(snap, req, rec)
}

// closeEvicted answers and records a connection whose slot a newcomer took
// while it waited for its client (server.go): 503 overloaded when the client has
// begun a request or has yet to send its first, then a half-close and a bounded
// drain. An idle keep-alive connection is only recorded: an answer it did not ask
// for would be read as the answer to its next request.
func (c *conn) closeEvicted(snap *Snapshot) {
	if c.release != nil { // the newcomer waits for the slot (slotWait), not for this answer
		c.release()
		c.l.overflow.Add(1)
		defer c.l.overflow.Add(-1)
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	defer rec.finish(&c.s.log, c.s.metrics)
	why := deny(allowlist.ReasonOverloaded, detailEvicted)
	if c.requests > 0 && c.br.Buffered() == 0 {
		rec.refused(why)
		return
	}
	c.nc.SetDeadline(time.Now().Add(time.Second))
	c.writeRefusalHead(snap, rec, why, 0, true)
	c.lingerClose()
}

// refuseHead answers a request head that could not be read or was malformed.
func (c *conn) refuseHead(snap *Snapshot, req *http.Request, err error) {
	if isTimeout(err) || isClosed(err) {
		return // the client went away or never finished: nobody to answer
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	if req != nil {
		rec.Method = req.Method
	}
	defer rec.finish(&c.s.log, c.s.metrics)
	switch {
	case err == errHeadTooLarge:
		c.writeRefusal(snap, rec, &refusal{Reason: allowlist.ReasonBadRequest, Detail: "header_too_large", Err: err},
			http.StatusRequestHeaderFieldsTooLarge)
	case err == errHeadBudget:
		// The head is still arriving: close after the answer, and read what
		// follows it for a moment so that the close does not destroy the answer.
		c.refuseAndClose(snap, rec, err)
	default:
		c.writeRefusal(snap, rec, badRequestFrom(err), 0)
	}
}

// writeRefusal records err on rec and writes its response. A status of 0 means the
// status docs/reasons.md assigns to the reason.
func (c *conn) writeRefusal(snap *Snapshot, rec *Record, err error, status int) {
	c.writeRefusalHead(snap, rec, err, status, false)
}

// writeRefusalHead is writeRefusal, announcing Connection: close when closeConn is
// set or the connection was accepted only to say why it is refused. The status
// line's reason phrase names the reason (refusalPhrase).
func (c *conn) writeRefusalHead(snap *Snapshot, rec *Record, err error, status int, closeConn bool) {
	code, h, body := refusalFor(snap, rec, err, status)
	writeHeadPhrase(c.bw, code, refusalPhrase(code, rec.Reason), h, closeConn || c.route.mode == modeRefused)
	n, _ := c.bw.Write(body)
	rec.BytesOut += int64(n)
	c.bw.Flush()
}

// refuseAndClose answers a refused CONNECT or Upgrade with Connection: close and
// ends the connection: whatever the client sent after the request (an optimistic
// ClientHello, an h2c preface, a pipelined request) is read only to be discarded,
// never parsed. It reports false, for the connection loop.
func (c *conn) refuseAndClose(snap *Snapshot, rec *Record, err error) bool {
	c.writeRefusalHead(snap, rec, err, 0, true)
	c.lingerClose()
	return false
}

// Bounds of lingerClose: how long and how much it reads after the refusal.
const (
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 64 << 10
)

// lingerClose half-closes the connection and discards what the client still sends,
// for a bounded time and size, before the caller closes it: closing a socket with
// unread bytes sends a reset, which can destroy the refusal before the client has
// read it (net/http's server does the same after an error).
func (c *conn) lingerClose() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c.nc, lingerBytes)
}

// rejectOverloaded answers a connection beyond the listener's bound with 503
// overloaded (detail names why, when it is not merely that) and closes it, after
// a half-close and a bounded drain so that the answer is read, not reset.
func (c *conn) rejectOverloaded(detail string) {
	defer c.abort()
	c.nc.SetDeadline(time.Now().Add(time.Second))
	rec := newRecord(c.l, c.nc.RemoteAddr())
	defer rec.finish(&c.s.log, c.s.metrics)
	c.writeRefusalHead(c.s.Snapshot(), rec, deny(allowlist.ReasonOverloaded, detail), 0, true)
	c.lingerClose()
}
