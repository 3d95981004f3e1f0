package proxy

import (
	"context"
	"net/http"
	"time"
)

// serveHTTP1 serves one HTTP/1.x request, in any mode, and reports whether the
// connection may carry another request.
func (c *conn) serveHTTP1(snap *Snapshot, req *http.Request, rec *Record) bool {
	x := newExchange(c, snap, req, rec, c.route)
	x.body.deadline = &bodyDeadline{set: c.nc.SetReadDeadline, perRead: snap.Limits.ReadHeader}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	x.unwatch = c.watchGone(req, cancel)
	keep := serveRequest(ctx, x, h1Side{c: c, wantClose: req.Close || !req.ProtoAtLeast(1, 1)})
	c.hookKeepAlive.Store(x.preHook)
	return keep
}

// h1Side is the tail's client side on an HTTP/1.x connection.
type h1Side struct {
	c         *conn
	wantClose bool // the client asked to close, or speaks HTTP/1.0
}

// sendContinue answers the client's Expect: 100-continue.
func (s h1Side) sendContinue() { s.c.writeContinue() }

// refuse writes the refusal. Only a request refused before anything was forwarded
// leaves the framing intact, once its body is drained; a refused CONNECT or Upgrade
// (or anything on a lane connection) closes at once: what the client sent after it
// belongs to another protocol and is never parsed.
func (s h1Side) refuse(x *exchange, err error) bool {
	if x.stage == stageLane || x.stage >= stagePrepare && switchesProtocol(x.req) {
		return s.c.refuseAndClose(x.snap, x.rec, err)
	}
	s.c.writeRefusal(x.snap, x.rec, err, 0)
	return x.stage == stagePrepare && !s.wantClose && x.body.drain()
}

// respond writes resp. A 101 switches the connection (serveUpgrade); a hook call's
// answer closes a lane or refused connection (it serves one call).
func (s h1Side) respond(x *exchange, resp *http.Response) bool {
	wantClose := s.wantClose
	switch {
	case x.stage == stageHook:
		wantClose = wantClose || x.lane != nil || x.route.mode == modeRefused
	case resp.StatusCode == http.StatusSwitchingProtocols:
		s.c.serveUpgrade(x, resp)
		return false
	}
	upgrade := x.stage != stageHook && switchesProtocol(x.req) // and the upstream declined it
	keep, err := writeResponse(s.c.bw, x.req.Method, wantClose || upgrade, resp, x.rec)
	if err == nil && (upgrade || x.stage == stageHook && !keep) {
		// What the client sent ahead belongs to the other protocol; a hook call's
		// body may still be on its way (a cut call is answered before it is
		// read): closing over unread bytes would reset the answer away.
		s.c.lingerClose()
	}
	return err == nil && keep && x.body.drain()
}

// writeContinue answers the client's Expect: 100-continue.
func (c *conn) writeContinue() {
	c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	c.bw.Flush()
}

// watchGone cancels the request (cancel) when its HTTP/1 client closes the
// connection while egressd decides, dials or waits for the upstream, so that nothing
// is dialled or forwarded for a client that has gone (client_cancelled), as an HTTP/2
// RST_STREAM does. Like net/http's server it reads the connection meanwhile; a byte
// it reads (a pipelined request) stays buffered for the next request. Only a request
// whose body is complete can be watched: a request with a body, an upgrade or a
// CONNECT is not. The returned stop ends the watch; call it before the connection is
// read or lingered on again.
func (c *conn) watchGone(req *http.Request, cancel context.CancelFunc) (stop func()) {
	if req.ContentLength != 0 || len(req.TransferEncoding) > 0 || switchesProtocol(req) {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.br.Peek(1); err != nil && !isTimeout(err) {
			cancel()
		}
	}()
	return func() {
		c.nc.SetReadDeadline(time.Unix(1, 0)) // ends the Peek
		<-done
		c.nc.SetReadDeadline(time.Time{})
	}
}
