package proxy

import (
	"errors"
	"net"
	"net/http"

	"github.com/egressd/egressd/internal/allowlist"
)

// serveConnect serves a CONNECT: decide on the authority (decideTunnel, which dials
// a spliced tunnel's checked address before the 200, so an unreachable or internal
// upstream is a refusal the client can read rather than a dropped tunnel); read the
// client's ClientHello and check that its SNI names the CONNECT host; then splice
// bytes until either side is done, or terminate TLS. A tunnel refused outright is
// answered with refuseAndClose: bytes sent ahead are never parsed.
func (c *conn) serveConnect(snap *Snapshot, req *http.Request, rec *Record) bool {
	rec.Scheme = "connect"
	c.authIdent = snap.Hooks.authIdent(req.Header)
	t, err := allowlist.ParseAuthority(req.RequestURI, 0)
	if err != nil {
		return c.refuseAndClose(snap, rec, badHost("connect_target", err))
	}
	plan, up, _ := c.decideTunnel(snap, t, nil, rec)
	if plan = plan.readableFor(req.RequestURI, t); plan.kind == tunnelRefused {
		return c.refuseAndClose(snap, rec, plan.why)
	}
	if !c.acceptTunnel(rec, plan.why) {
		closeIf(up)
		return false
	}
	hello, err := c.checkClientHello(snap, t)
	if errors.Is(err, errPlainHTTP) {
		closeIf(up)
		c.servePlainTunnel(t, plan.why)
		return false
	}
	if err == nil {
		plan, err = c.applyHelloPlan(snap, t, hello, plan)
	}
	switch {
	case err != nil:
		rec.refused(err)
		closeIf(up)
	case plan.kind == tunnelSpliced:
		c.tunnel(snap, t, up, hello, rec)
	default:
		closeIf(up) // an Encrypted Client Hello turned a spliced tunnel intercepted
		c.serveIntercepted(snap, t, hello, rec, plan.why)
	}
	return false
}

// applyHelloPlan is helloPlan with its refusal told to the client as the TLS alert
// unrecognized_name: the client is speaking TLS and reads nothing else.
func (c *conn) applyHelloPlan(snap *Snapshot, t allowlist.Target, hello *clientHello, plan tunnelPlan) (tunnelPlan, error) {
	plan, err := helloPlan(snap, t, hello, plan)
	if err != nil {
		c.nc.Write(alertUnrecognizedName)
	}
	return plan, err
}

// acceptTunnel answers 200 to a CONNECT. On a tunnel accepted only to say why it
// is refused (why), the 200 carries Egressd-Reason, so `curl -v` shows the verdict
// at once.
func (c *conn) acceptTunnel(rec *Record, why error) bool {
	c.bw.WriteString("HTTP/1.1 200 Connection established\r\n")
	if why != nil {
		c.bw.WriteString("Egressd-Reason: " + string(classify(why).Reason) + "\r\n")
	}
	c.bw.WriteString("\r\n")
	rec.Status = http.StatusOK
	return c.bw.Flush() == nil
}

// checkClientHello reads the ClientHello the client sends into the tunnel, without
// consuming it, and refuses a tunnel whose SNI names another host than the CONNECT
// target (domain fronting) with the TLS alert unrecognized_name, or one that does
// not start with a ClientHello at all.
func (c *conn) checkClientHello(snap *Snapshot, t allowlist.Target) (*clientHello, error) {
	c.waitFor(snap.Limits.ReadHeader)
	hello, err := c.readClientHello()
	if err != nil {
		return nil, err
	}
	if hello.serverName != "" && !sameSNI(hello.serverName, t) {
		c.nc.Write(alertUnrecognizedName)
		return nil, &refusal{Reason: allowlist.ReasonHostMismatch, Detail: "sni",
			Err: errors.New("SNI " + hello.serverName + " in a tunnel to " + t.Host)}
	}
	return hello, nil
}

// errPlainHTTP: a tunnel whose first bytes are not a TLS handshake record.
var errPlainHTTP = errors.New("plain HTTP in a CONNECT tunnel")

// servePlainTunnel serves a CONNECT tunnel whose first bytes are not a ClientHello
// (Node's undici tunnels http:// URLs so) as plain HTTP against the tunnel's target:
// every request is decided again as an http:// request, so plaintext_credential and
// every other check such a request gets apply, and a refused tunnel answers each
// request with its refusal.
func (c *conn) servePlainTunnel(t allowlist.Target, why error) {
	r := tunnelRoute(t, why)
	r.plain = true
	c.serveInner(&replayConn{Conn: c.nc, r: c.br}, r)
}

// readClientHello reads the client's ClientHello without consuming it, within the
// wait begun by waitFor: a connection evicted meanwhile gets the refusal instead,
// one whose first byte is not a TLS handshake record errPlainHTTP, one the client
// closed before its first byte client_cancelled, and one that does not parse as a
// ClientHello not_tls.
func (c *conn) readClientHello() (*clientHello, error) {
	first, err := c.br.Peek(1)
	switch {
	case err == nil && first[0] != recordTypeHandshake:
		if !c.waited() {
			return nil, deny(allowlist.ReasonOverloaded, detailEvicted)
		}
		return nil, errPlainHTTP
	case err != nil && isClosed(err):
		if !c.waited() {
			return nil, deny(allowlist.ReasonOverloaded, detailEvicted)
		}
		return nil, clientCancelled(err) // the client left without a byte, not a bad hello
	}
	hello, err := peekClientHello(c.br)
	if !c.waited() {
		return nil, deny(allowlist.ReasonOverloaded, detailEvicted)
	}
	if err != nil {
		return nil, badRequest("not_tls", err)
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
