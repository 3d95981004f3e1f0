package proxy

import (
	"errors"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/origdst"
)

// alertMissingExtension is a fatal TLS alert, missing_extension (RFC 8446 §6.2,
// alert 109), sent to a ClientHello without SNI that egressd cannot decide on.
var alertMissingExtension = []byte{21, 3, 3, 0, 2, 2, 109}

// serveTransparent serves a connection REDIRECTed from the sandbox's namespace. The
// original destination supplies only the port (and, for a TLS client without SNI,
// an address the allowlist may name); the policy host is the SNI or the Host header,
// which egressd resolves and checks itself. TLS and plain HTTP share the port and
// are told apart by the first byte.
func (c *conn) serveTransparent() {
	defer c.abort()
	defer c.recoverPanic()
	orig, err := origdst.Get(c.nc)
	if err != nil {
		c.s.log.Warn().Err(err).Str("listener", c.l.cfg.Name).Msg("no original destination; connection closed")
		return
	}
	c.orig = orig
	rt := c.s.Runtime()
	c.waitFor(rt.Limits.ReadHeader)
	first, err := c.br.Peek(1)
	if err != nil {
		return
	}
	if first[0] != 0x16 { // not a TLS handshake record: plain HTTP
		if c.waited() { // serveLoop waits for each request head anew
			c.serveLoop()
		}
		return
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	rec.Scheme = "tls"
	defer rec.finish(&c.s.log, c.s.metrics)
	c.serveTransparentTLS(rt, rec)
}

// serveTransparentTLS decides on the ClientHello's SNI and splices, intercepts, or
// completes the handshake with a leaf for the SNI to answer the refusal over HTTP.
func (c *conn) serveTransparentTLS(rt *Runtime, rec *Record) {
	hello, err := peekClientHello(c.br)
	if !c.waited() {
		rec.fail(allowlist.ReasonOverloaded, detailEvicted)
		return
	}
	if err != nil {
		rec.fail(allowlist.ReasonBadRequest, "not_tls")
		rec.Error = err.Error()
		return
	}
	t, err := c.transparentTLSTarget(hello)
	if err != nil {
		rec.setTarget(allowlist.Target{Host: c.orig.Addr().String(), Addr: c.orig.Addr(), Port: c.orig.Port()})
		rec.fail(allowlist.ReasonBadRequest, badHost("no_sni", err).Detail)
		rec.Error = err.Error()
		c.nc.Write(alertMissingExtension)
		return
	}
	rec.setTarget(t)
	d := rt.Policy.DecideRequest(t, "")
	rec.setDecision(d)
	intercept, ok := c.tunnelPlan(rt, t, d)
	switch {
	case !ok:
		c.refuseOverTLS(rt, t, hello, deny(d.Reason, d.Detail), rec)
	case intercept:
		c.serveIntercepted(rt, t, hello, rec)
	default:
		up, err := rt.dialTarget(c.ctx, t)
		if err != nil {
			rec.fail(classify(err).Reason, classify(err).Detail)
			c.refuseOverTLS(rt, t, hello, err, rec)
			return
		}
		rec.setResolved(up.RemoteAddr())
		c.tunnel(rt, up, hello, rec)
	}
}

// transparentTLSTarget is the SNI with the original port; without SNI, the original
// destination itself, which only an allowlist entry naming that IP can allow.
func (c *conn) transparentTLSTarget(hello *clientHello) (allowlist.Target, error) {
	if hello.serverName != "" {
		host, addr, err := allowlist.NormalizeHost(hello.serverName)
		return allowlist.Target{Host: host, Addr: addr, Port: c.orig.Port()}, err
	}
	ip := c.orig.Addr().Unmap()
	t := allowlist.Target{Host: ip.String(), Addr: ip, Port: c.orig.Port()}
	if d := c.s.Runtime().Policy.Decide(t); !d.Allowed() || d.Rule.Pattern == "*" {
		return t, errors.New("ClientHello without SNI to an address no entry names")
	}
	return t, nil
}

// refuseOverTLS completes the client's handshake with a leaf for the SNI and answers
// every request on it with the refusal, so the agent sees why instead of a reset.
func (c *conn) refuseOverTLS(rt *Runtime, t allowlist.Target, hello *clientHello, why error, rec *Record) {
	rf := classify(why)
	rec.fail(rf.Reason, rf.Detail)
	c.refuseAll = why
	c.serveIntercepted(rt, t, hello, rec)
}
