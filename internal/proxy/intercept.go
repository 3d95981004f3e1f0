package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// serveIntercepted terminates the client's TLS with a leaf for the CONNECT target
// (never for a name the client sends later) and serves the requests inside over
// HTTP/2 or HTTP/1.1, as ALPN says. Each request is decided again, against the
// target, on the Snapshot current when it arrives; or, when the tunnel was refused
// with why, answered with the refusal (modeRefused).
func (c *conn) serveIntercepted(snap *Snapshot, t allowlist.Target, hello *clientHello, rec *Record, why error) {
	rec.Intercepted = true
	if snap.Leaves == nil {
		rec.refused(&refusal{Reason: allowlist.ReasonUpstreamTLS, Detail: "no_ca",
			Err: errors.New("interception needed but no CA is configured")})
		return
	}
	if !c.holdTransparentTunnel(snap, t) {
		rec.refused(errConnMemory) // no answer fits in TLS not yet begun: closed, logged
		return
	}
	c.tunneling.Store(true)
	c.s.metrics.TunnelsActive.Inc()
	defer c.s.metrics.TunnelsActive.Dec()
	client := &replayConn{Conn: c.nc, r: io.MultiReader(bytes.NewReader(hello.raw), c.br)}
	tc := tls.Server(client, snap.Leaves.ServerConfigFor(c.nc.RemoteAddr(), t.Host, []string{"h2", "http/1.1"}))
	tc.SetDeadline(time.Now().Add(snap.Limits.ReadHeader))
	if err := tc.HandshakeContext(c.ctx); err != nil {
		rec.refused(clientTLSFailure(err, client.wrote, t.Host))
		return
	}
	tc.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		c.serveH2(snap, tc, tunnelRoute(t, why))
		return
	}
	c.serveInner(tc, tunnelRoute(t, why))
}

// serveInner serves the HTTP/1.x requests inside a tunnel, read from nc (the
// terminated TLS, or the client's own bytes), on route: a connection of its own that
// shares the outer one's slot, lane and end.
func (c *conn) serveInner(nc net.Conn, via route) {
	inner := newConn(c.s, c.l, nc)
	inner.route = via
	inner.slot, inner.lane, inner.cutCtx, inner.laneRoot = c.slot, c.lane, c.cutCtx, c.laneRoot
	inner.release, inner.authIdent, inner.mem = c.release, c.authIdent, c.mem
	inner.ctx, inner.cancel = context.WithCancel(c.ctx) // the outer's end (or cut) ends it
	if c.s.trackConn(inner, true) {
		defer c.s.trackConn(inner, false)
		inner.serve()
	}
}

// detailUntrustedCA is the detail of a handshake the client ended because it does
// not trust egressd's certificate.
const detailUntrustedCA = "client_untrusted_ca"

// clientTLSFailure is the refusal of a failed handshake with the client. A client
// that rejects egressd's leaf (alert unknown_ca, bad_certificate,
// certificate_unknown or unsupported_certificate, or a close or an undecryptable
// record right after egressd's ServerHello) does not trust egressd's CA: the log says
// so and names the fix, rather than reading as corruption.
func clientTLSFailure(err error, serverSpoke bool, host string) *refusal {
	if !rejectedLeaf(err, serverSpoke) {
		return badRequest("client_tls", err)
	}
	return badRequest(detailUntrustedCA, fmt.Errorf("%w: the client rejected egressd's certificate for %s"+
		"; make the sandbox trust egressd's CA: run `egressd ca env` and export what it prints in the sandbox", err, host))
}

func rejectedLeaf(err error, serverSpoke bool) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		msg := op.Err.Error()
		return strings.Contains(msg, "unknown certificate authority") || strings.Contains(msg, "bad certificate") ||
			strings.Contains(msg, "certificate unknown") || strings.Contains(msg, "unsupported certificate")
	}
	return serverSpoke && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(err.Error(), "bad record MAC"))
}
