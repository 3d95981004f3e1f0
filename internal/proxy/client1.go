package proxy

import (
	"net/http"

	"github.com/egressd/egressd/internal/hooks"
)

// serveHTTP1 serves one HTTP/1.x request, in any mode but modeRefused, and reports whether the connection may carry
// another request.
func (c *conn) serveHTTP1(rt *Runtime, req *http.Request, rec *Record) bool {
	x := newExchange(c, rt, req, rec, c.route)
	defer x.body.Close()
	x.body.deadline = &bodyDeadline{set: c.nc.SetReadDeadline, perRead: rt.Limits.ReadHeader}
	wantClose := req.Close || !req.ProtoAtLeast(1, 1)
	m, ok := x.hookMatch(c.l.cfg.Role)
	c.hookKeepAlive.Store(ok && m.Event == hooks.EventPre)
	if c.lane && !(ok && m.Event == hooks.EventPre) {
		return c.refuseAndClose(rt, rec, laneRefusal())
	}
	if ok {
		if expectsContinue(req) {
			x.body.sendContinue = c.writeContinue
		}
		return c.writeHookResponse(rt, x, m, wantClose || c.lane) // a lane connection serves one call
	}
	out, err := x.prepare(c.ctx)
	if err != nil {
		if switchesProtocol(req) {
			return c.refuseAndClose(rt, rec, err)
		}
		c.writeRefusal(rt, rec, err, 0)
		return !wantClose && x.body.drain()
	}
	if expectsContinue(req) {
		c.writeContinue()
	}
	resp, err := rt.roundTrip(out, rec)
	if err != nil {
		rec.BytesIn = x.body.n.Load()
		if bodyErr := x.body.clientError(); bodyErr != nil {
			err = bodyErr
		}
		if switchesProtocol(req) {
			return c.refuseAndClose(rt, rec, err)
		}
		c.writeRefusal(rt, rec, err, 0)
		return false
	}
	resp = x.scrubbed(resp)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		rec.BytesIn = x.body.n.Load()
		c.serveUpgrade(resp, rec)
		return false
	}
	upgrade := switchesProtocol(req) // and the upstream declined it
	keep, err := writeResponse(c.bw, req.Method, wantClose || upgrade, resp, rec)
	rec.BytesIn = x.body.n.Load()
	if upgrade && err == nil {
		c.lingerClose() // what the client sent ahead belongs to the other protocol
	}
	return err == nil && keep && x.body.drain()
}

// writeHookResponse serves a hook call (see exchange.serveHook) on HTTP/1.1.
func (c *conn) writeHookResponse(rt *Runtime, x *exchange, m hooks.Match, wantClose bool) bool {
	resp, err := x.serveHook(c.ctx, m, c.route.refusal)
	x.rec.BytesIn = x.body.n.Load()
	if err != nil {
		c.writeRefusal(rt, x.rec, err, 0)
		return false
	}
	resp = x.scrubbed(resp)
	defer resp.Body.Close()
	keep, err := writeResponse(c.bw, x.req.Method, wantClose, resp, x.rec)
	return err == nil && keep && x.body.drain()
}

// writeContinue answers the client's Expect: 100-continue.
func (c *conn) writeContinue() {
	c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	c.bw.Flush()
}
