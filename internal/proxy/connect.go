package proxy

import (
	"net"
	"net/http"

	"github.com/egressd/egressd/internal/allowlist"
)

// serveConnect serves a CONNECT: decide on the authority, answer 200, read the
// client's ClientHello and check that its SNI names the CONNECT host, then either
// terminate TLS (the rule injects, or intercept is "all") or dial a checked address
// and splice bytes until either side is done. A refused CONNECT is answered by
// refuseConnect; the connection then closes.
func (c *conn) serveConnect(rt *Runtime, req *http.Request, rec *Record) bool {
	rec.Scheme = "connect"
	t, err := allowlist.ParseAuthority(req.RequestURI, 0)
	if err != nil {
		return c.refuseAndClose(rt, rec, badHost("connect_target", err))
	}
	rec.setTarget(t)
	d := rt.Policy.DecideRequest(t, "")
	rec.setDecision(d)
	intercept, ok := c.tunnelPlan(rt, t, d)
	if !ok {
		return c.refuseConnect(rt, t, deny(d.Reason, d.Detail), rec)
	}
	var up net.Conn
	if !intercept {
		// Dial before answering 200, so an unreachable or internal upstream is a
		// refusal the client can read rather than a dropped tunnel.
		if up, err = rt.dialTarget(c.ctx, t); err != nil {
			return c.refuseConnect(rt, t, err, rec)
		}
		rec.setResolved(up.RemoteAddr())
	}
	if !c.acceptTunnel(rec) {
		closeIf(up)
		return false
	}
	hello, err := c.checkClientHello(rt, t, rec)
	if err != nil {
		closeIf(up)
		return false
	}
	if intercept {
		c.serveIntercepted(rt, t, hello, rec)
		return false
	}
	c.tunnel(rt, up, hello, rec)
	return false
}

// acceptTunnel answers 200 to a CONNECT. On a tunnel accepted only to say why it
// is refused, the 200 carries Egressd-Reason, so `curl -v` shows the verdict at once.
func (c *conn) acceptTunnel(rec *Record) bool {
	c.bw.WriteString("HTTP/1.1 200 Connection established\r\n")
	if c.refuseAll != nil {
		c.bw.WriteString("Egressd-Reason: " + string(classify(c.refuseAll).Reason) + "\r\n")
	}
	c.bw.WriteString("\r\n")
	rec.Status = http.StatusOK
	return c.bw.Flush() == nil
}

// refuseConnect answers a refused CONNECT. With tls.deny_in_tunnel in effect, the
// tunnel is accepted, TLS is completed with egressd's leaf for the requested name
// (minted within the shared leaf budget) and the first request inside gets the
// refusal with its JSON body, then the connection closes: clients show a response
// body, never a CONNECT's. What is not a ClientHello is never parsed. Otherwise the
// refusal replaces the 200 (refuseAndClose: bytes sent ahead are never parsed).
func (c *conn) refuseConnect(rt *Runtime, t allowlist.Target, why error, rec *Record) bool {
	if !rt.DenyInTunnel || rt.Leaves == nil {
		return c.refuseAndClose(rt, rec, why)
	}
	rf := classify(why)
	rec.fail(rf.Reason, rf.Detail)
	if rf.Err != nil {
		rec.Error = rf.Err.Error()
	}
	c.refuseAll = why
	if !c.acceptTunnel(rec) {
		return false
	}
	if hello, err := c.checkClientHello(rt, t, rec); err == nil {
		c.serveIntercepted(rt, t, hello, rec)
	}
	return false
}

// tunnelPlan decides what a tunnel to t becomes: intercepted when the rule injects or
// t serves hook URLs, spliced otherwise. A denied tunnel to a hook host is still
// accepted and intercepted when hooks fail closed: the runtime reads a refused
// CONNECT as "allow", so egressd answers the hook call inside with an explicit deny
// (c.refuseAll). ok is false when the tunnel is refused outright.
func (c *conn) tunnelPlan(rt *Runtime, t allowlist.Target, d allowlist.Decision) (intercept, ok bool) {
	hookHost := rt.Hooks != nil && rt.Hooks.Index != nil && rt.Hooks.Index.Intercepts(t.Host, t.Port)
	if d.Allowed() {
		return d.Intercept || hookHost || rt.Placeholders.Intercepts(t.Host), true
	}
	if hookHost && rt.Hooks.FailClosed {
		c.refuseAll = deny(d.Reason, d.Detail)
		return true, true
	}
	return false, false
}

// checkClientHello reads the ClientHello the client sends into the tunnel, without
// consuming it, and refuses a tunnel whose SNI names another host than the CONNECT
// target (domain fronting) with the TLS alert unrecognized_name, or one that does
// not start with a ClientHello at all.
func (c *conn) checkClientHello(rt *Runtime, t allowlist.Target, rec *Record) (*clientHello, error) {
	c.waitFor(rt.Limits.ReadHeader)
	hello, err := peekClientHello(c.br)
	if !c.waited() {
		rec.fail(allowlist.ReasonOverloaded, detailEvicted)
		return nil, errEvicted
	}
	if err != nil {
		rec.fail(allowlist.ReasonBadRequest, "not_tls")
		rec.Error = err.Error()
		return nil, err
	}
	if hello.serverName != "" && !sameSNI(hello.serverName, t) {
		rec.fail(allowlist.ReasonHostMismatch, "sni")
		rec.Error = "SNI " + hello.serverName + " in a tunnel to " + t.Host
		c.nc.Write(alertUnrecognizedName)
		return nil, errSNIMismatch
	}
	return hello, nil
}

func sameSNI(sni string, t allowlist.Target) bool {
	host, _, err := allowlist.NormalizeHost(sni)
	return err == nil && host == t.Host
}

func closeIf(c net.Conn) {
	if c != nil {
		c.Close()
	}
}
