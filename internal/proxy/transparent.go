package proxy

import (
	"errors"
	"net/netip"

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
	c.route = route{mode: modeTransparent, orig: orig}
	snap := c.s.Snapshot()
	c.waitFor(snap.Limits.ReadHeader)
	first, err := c.br.Peek(1)
	if err != nil {
		if c.waitSince.Load() == evicted {
			c.closeEvicted(snap)
		}
		return
	}
	if first[0] != recordTypeHandshake { // plain HTTP
		if c.waited() { // serveLoop waits for each request head anew
			c.serveLoop()
		}
		return
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	rec.Scheme = "tls"
	defer rec.finish(&c.s.log, c.s.metrics)
	defer c.recordClose(rec)
	c.serveTransparentTLS(snap, rec)
}

// serveTransparentTLS decides on the ClientHello's SNI (decideTunnel) and splices
// or intercepts; a refused connection is intercepted to answer the refusal over
// HTTP, so the agent sees why instead of a reset.
func (c *conn) serveTransparentTLS(snap *Snapshot, rec *Record) {
	hello, err := c.readClientHello()
	if err != nil {
		rec.refused(err)
		return
	}
	t, err := transparentTLSTarget(snap, c.route.orig, hello)
	if err != nil {
		rec.setTarget(t)
		rec.refused(badHost("no_sni", err))
		c.nc.Write(alertMissingExtension)
		return
	}
	plan, up, err := c.decideTunnel(snap, t, hello, rec)
	switch {
	case err != nil:
	case up != nil:
		c.tunnel(snap, t, up, hello, rec)
	default:
		c.serveIntercepted(snap, t, hello, rec, plan.why)
	}
}

// transparentTLSTarget is the SNI with the original port; without SNI (or with
// one that is no name), the original destination itself, which only an allowlist
// entry naming that IP can allow.
func transparentTLSTarget(snap *Snapshot, orig netip.AddrPort, hello *clientHello) (allowlist.Target, error) {
	ip := orig.Addr().Unmap()
	t := allowlist.Target{Host: ip.String(), Addr: ip, Port: orig.Port()}
	if hello.serverName != "" {
		host, addr, err := allowlist.NormalizeHost(hello.serverName)
		if err != nil {
			return t, err
		}
		return allowlist.Target{Host: host, Addr: addr, Port: orig.Port()}, nil
	}
	if !namesAddress(snap.Policy.Decide(t)) {
		return t, errors.New("ClientHello without SNI to an address no entry names")
	}
	return t, nil
}
