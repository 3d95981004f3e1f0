package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/origdst"
)

// A tunnel, a CONNECT or TLS on a transparent listener, is decided once, in
// decideTunnel, and becomes what planTunnel says: refused, spliced (dialled before
// anything is answered, then copied both ways unread, and decided again while open
// on every change of state), or intercepted (the client's TLS completed here, its
// requests served by conn.go or h2.go and each decided again by the tail). The
// ClientHello is read without being consumed, so a spliced upstream sees it as sent.

// tunnelRoute is the route of the requests inside an intercepted tunnel to t:
// decided again (why == nil) or all refused with why.
func tunnelRoute(t allowlist.Target, why error) route {
	if why != nil {
		return route{mode: modeRefused, target: t, refusal: why}
	}
	return route{mode: modeTunnel, target: t}
}

// tunnelKind is what a tunnel (a CONNECT, or TLS on a transparent listener) becomes.
type tunnelKind uint8

const (
	tunnelRefused       tunnelKind = iota // the refusal replaces the CONNECT's 200; the connection closes
	tunnelSpliced                         // dialled and copied both ways, unread
	tunnelIntercepted                     // TLS terminated; requests inside in modeTunnel
	tunnelRefusedInside                   // TLS terminated only to refuse every request (modeRefused)
)

// tunnelPlan is what a tunnel becomes and, when refused, why.
type tunnelPlan struct {
	kind tunnelKind
	why  error
}

// planTunnel is the one place that decides whether a tunnel to t is intercepted:
// when the rule injects or intercept is "all" (d.Intercept), when t serves hook URLs
// or trusts a placeholder; spliced otherwise. inTLS is set when the client has
// already sent its ClientHello (a transparent listener), so a refusal can only be
// answered inside TLS.
func planTunnel(snap *Snapshot, t allowlist.Target, d allowlist.Decision, inTLS bool) tunnelPlan {
	hookHost := snap.Hooks != nil && snap.Hooks.Index != nil && snap.Hooks.Index.Intercepts(t.Host, t.Port)
	if d.Allowed() && !d.Intercept && !hookHost {
		// Whether t trusts a placeholder is known once its credentials are read: wait,
		// bounded, for first reads still in flight after a start, rather than splice.
		snap.Placeholders.Await(context.Background())
	}
	switch {
	case d.Allowed() && (d.Intercept || hookHost || snap.Placeholders.Intercepts(t.Host)):
		return tunnelPlan{kind: tunnelIntercepted}
	case d.Allowed():
		return tunnelPlan{kind: tunnelSpliced}
	}
	// A denied tunnel to a hook host is still accepted and intercepted when hooks
	// fail closed: the runtime reads a refused CONNECT as "allow", so egressd answers
	// the hook call inside with an explicit deny.
	return refusedTunnel(snap, deny(d.Reason, d.Detail), inTLS || hookHost && snap.Hooks.FailClosed)
}

// decideTunnel is the one decision of a tunnel, a CONNECT (hello nil: it arrives
// after the 200) or TLS on a transparent listener: decide on t and record it, plan
// the tunnel (planTunnel, then helloPlan when the ClientHello is known), and dial a
// spliced tunnel's upstream now. A refused plan is recorded here; an upstream that
// cannot be dialled refuses the tunnel (refusedTunnel). The error is a ClientHello
// refused by helloPlan, told to the client as a TLS alert.
func (c *conn) decideTunnel(snap *Snapshot, t allowlist.Target, hello *clientHello, rec *Record) (tunnelPlan, net.Conn, error) {
	rec.setTarget(t)
	d := snap.Policy.DecideRequest(t, "")
	rec.setDecision(d)
	plan := planTunnel(snap, t, d, hello != nil)
	if hello != nil {
		var err error
		if plan, err = c.applyHelloPlan(snap, t, hello, plan); err != nil {
			rec.refused(err)
			return plan, nil, err
		}
	}
	var up net.Conn
	if plan.kind == tunnelSpliced {
		var err error
		if up, err = snap.upstream.Dial(c.ctx, t); err != nil {
			plan = refusedTunnel(snap, err, hello != nil)
		} else {
			rec.setResolved(up.RemoteAddr())
		}
	}
	if plan.why != nil {
		rec.refused(plan.why)
	}
	return plan, up, nil
}

// refusedTunnel is the plan of a tunnel refused with why. It is answered inside TLS
// (a leaf for the requested name, the refusal to the first request; clients show a
// response body, never a CONNECT's) when inside is set or tls.deny_in_tunnel is in
// effect with a CA; otherwise the refusal replaces the 200.
func refusedTunnel(snap *Snapshot, why error, inside bool) tunnelPlan {
	if inside || snap.DenyInTunnel && snap.Leaves != nil {
		return tunnelPlan{kind: tunnelRefusedInside, why: why}
	}
	return tunnelPlan{kind: tunnelRefused, why: why}
}

// leafNames reports whether a leaf for t names the CONNECT target as the client
// spelled it (authority), so that the client can verify egressd's certificate: not
// for a non-canonical IPv4 spelling (2130706433, 0x7f.1, 0177.0.0.1, 127.1), an IPv6
// text another client would spell differently, or a name that was not ASCII.
// Case and a trailing dot change nothing a verifier compares.
func leafNames(authority string, t allowlist.Target) bool {
	host := authority
	if h, _, err := net.SplitHostPort(authority); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	return host == t.Host
}

// readableFor is the plan for a CONNECT to authority: a refusal egressd would
// answer inside TLS replaces the 200 instead when no leaf could name the target as
// the client spelled it, since the client would show a certificate error, not the
// reason.
func (p tunnelPlan) readableFor(authority string, t allowlist.Target) tunnelPlan {
	if p.kind == tunnelRefusedInside && !leafNames(authority, t) {
		p.kind = tunnelRefused
	}
	return p
}

// helloPlan applies the ClientHello rules of a tunnel planned as spliced, which
// egressd will never read inside (docs/policy.md#clienthello-rules): a named target
// needs SNI, and Encrypted Client Hello, whose inner hello could name any tenant of
// the same edge, is intercepted where the sandbox trusts egressd's CA and refused
// elsewhere. The SNI itself was checked against the target when the hello was read.
func helloPlan(snap *Snapshot, t allowlist.Target, hello *clientHello, plan tunnelPlan) (tunnelPlan, error) {
	if plan.kind != tunnelSpliced {
		return plan, nil
	}
	switch {
	case hello.ech && snap.Policy.Intercepts():
		return tunnelPlan{kind: tunnelIntercepted}, nil
	case hello.ech:
		return plan, &refusal{Reason: allowlist.ReasonHostMismatch, Detail: detailECH,
			Err: errors.New("Encrypted Client Hello in a tunnel to " + t.Host + " that egressd does not intercept")}
	case hello.serverName == "" && !t.IsIP():
		return plan, &refusal{Reason: allowlist.ReasonHostMismatch, Detail: detailNoSNI,
			Err: errors.New("ClientHello without SNI in a tunnel to " + t.Host)}
	}
	return plan, nil
}

// Details of a spliced tunnel's ClientHello refused by helloPlan.
const (
	detailNoSNI = "no_sni"
	detailECH   = "ech"
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

var errPeeked = errors.New("ClientHello read")

// recordTypeHandshake is the first byte of a TLS handshake record (RFC 8446 §5.1),
// which a ClientHello starts with; anything else is taken for plain HTTP.
const recordTypeHandshake = 0x16

// alertUnrecognizedName is a fatal TLS alert record, unrecognized_name (RFC 8446
// §6.2, alert 112), sent when a tunnel's SNI names another host.
var alertUnrecognizedName = []byte{21, 3, 3, 0, 2, 2, 112}

// clientHello is what egressd reads from a ClientHello before deciding what to do
// with the connection, and the bytes it read to learn it.
type clientHello struct {
	serverName string
	alpn       []string
	raw        []byte // the bytes read from the client; they are replayed
	// ech: the hello carries encrypted_client_hello (RFC 9849), real or GREASE; its
	// inner hello may name any host behind the same edge.
	ech bool
}

// extensionECH is the encrypted_client_hello extension's code point.
const extensionECH = 0xfe0d

// maxClientHello bounds the bytes read while looking for a ClientHello.
const maxClientHello = 64 << 10

// peekClientHello parses the client's ClientHello with crypto/tls itself. The bytes
// it reads are kept in the result, so the connection can still be spliced or
// terminated by replaying them. The handshake stops inside GetConfigForClient;
// nothing is written to the client.
func peekClientHello(r io.Reader) (*clientHello, error) {
	hello := &clientHello{}
	rec := &recordingConn{r: io.LimitReader(r, maxClientHello), hello: hello}
	var got bool
	err := tls.Server(rec, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello.serverName, got = h.ServerName, true
			hello.alpn = append([]string(nil), h.SupportedProtos...)
			hello.ech = slices.Contains(h.Extensions, extensionECH)
			return nil, errPeeked
		},
	}).Handshake()
	if !got {
		return nil, err
	}
	return hello, nil
}

// recordingConn feeds crypto/tls and keeps every byte it reads; writes (the alert
// crypto/tls sends when the peek stops it) go nowhere.
type recordingConn struct {
	r     io.Reader
	hello *clientHello
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.hello.raw = append(c.hello.raw, b[:n]...)
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *recordingConn) Close() error                     { return nil }
func (c *recordingConn) LocalAddr() net.Addr              { return nil }
func (c *recordingConn) RemoteAddr() net.Addr             { return nil }
func (c *recordingConn) SetDeadline(time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }

// replayConn is a client connection whose first bytes were already read: they are
// read again first.
type replayConn struct {
	net.Conn
	r     io.Reader
	wrote bool // egressd has written to the client (its ServerHello); one goroutine handshakes
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *replayConn) Write(p []byte) (int, error) {
	c.wrote = true
	return c.Conn.Write(p)
}

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
	tc := tls.Server(client, snap.Leaves.ServerConfigFor(snap.Sandbox, c.nc.RemoteAddr(), t.Host, []string{"h2", "http/1.1"}))
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
	inner.release, inner.authIdent, inner.mem, inner.began = c.release, c.authIdent, c.mem, c.began
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

// tunnel splices the client connection and up, a tunnel to t, until both directions
// end, or a change of state refuses it . The bytes already read from the
// client (its ClientHello, and whatever is buffered) go first.
func (c *conn) tunnel(snap *Snapshot, t allowlist.Target, up net.Conn, hello *clientHello, rec *Record) {
	defer up.Close()
	o := &openConn{target: t, upstream: upstreamAddr(up.RemoteAddr()),
		sniless: c.route.mode == modeTransparent && hello.serverName == "",
		close:   func() { c.nc.Close(); up.Close() }}
	c.s.register(o)
	defer c.s.unregister(o)
	defer o.ended(rec)
	c.tunneling.Store(true)
	c.s.metrics.TunnelsActive.Inc()
	defer c.s.metrics.TunnelsActive.Dec()
	early := hello.raw
	if n := c.br.Buffered(); n > 0 {
		buffered, _ := c.br.Peek(n)
		early = append(early, buffered...)
	}
	if _, err := up.Write(early); err != nil {
		return
	}
	rec.BytesIn += int64(len(early))
	c.br, c.bw = nil, nil // a tunnel holds no buffers
	idle := snap.Limits.TunnelIdle
	done := make(chan int64, 1)
	go func() {
		n, _ := pipe(up, c.nc, idle, c.nc, up)
		done <- n
	}()
	out, _ := pipe(&clientWriter{Conn: c.nc, d: snap.Limits.ClientWrite}, up, idle, c.nc, up)
	rec.BytesOut += out
	rec.BytesIn += <-done
}

// pipe copies src to dst until src ends, then half-closes dst. Each read may wait up
// to idle; when it times out the tunnel is kept if either connection received data
// within idle (asked of the kernel: the other direction's reads do not report here).
// On any other error both connections are closed so the opposite direction ends too.
func pipe(dst, src net.Conn, idle time.Duration, a, b net.Conn) (int64, error) {
	var total int64
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := relay(dst, src)
		total += n
		switch {
		case err == nil:
			closeWrite(dst)
			return total, nil
		case isTimeout(err) && (n > 0 || recentlyActive(a, idle) || recentlyActive(b, idle)):
			continue
		default:
			a.Close()
			b.Close()
			return total, err
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// rawConn is c's socket, for the calls net.Conn has no method for.
func rawConn(c net.Conn) (syscall.RawConn, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, false
	}
	raw, err := sc.SyscallConn()
	return raw, err == nil
}

// recentlyActive reports whether c received data within d, from TCP_INFO.
func recentlyActive(c net.Conn, d time.Duration) bool {
	raw, ok := rawConn(c)
	if !ok {
		return false
	}
	var info *unix.TCPInfo
	var err error
	raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO) })
	if err != nil || info == nil {
		return false
	}
	return time.Duration(info.Last_data_recv)*time.Millisecond < d
}

// serveUpgrade completes a 101 Switching Protocols (WebSocket and the like) to x:
// the response goes to the client, then bytes are spliced both ways, the client's
// read through x.upgradeSource, until either side ends, a placeholder in what the
// client sends ends both, or a change of state refuses the connection .
func (c *conn) serveUpgrade(x *exchange, resp *http.Response) {
	rec := x.rec
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		c.writeRefusal(c.s.Snapshot(), rec, errors.New("upgrade response without a connection"), 0)
		return
	}
	defer up.Close()
	o := &openConn{target: x.target, scheme: x.scheme, upstream: resolvedAddr(rec, x.target.Port),
		credential: rec.Credential, close: func() { c.nc.Close(); up.Close() }}
	c.s.register(o)
	defer c.s.unregister(o)
	defer o.ended(rec)
	c.tunneling.Store(true)
	rec.Status = resp.StatusCode
	hdr := resp.Header.Clone()
	removeHopByHop(hdr)
	hdr.Set("Connection", "Upgrade")
	hdr.Set("Upgrade", resp.Header.Get("Upgrade"))
	writeHead(c.bw, resp.StatusCode, hdr, false)
	if err := c.bw.Flush(); err != nil {
		return
	}
	idle := watchIdle(x.snap.Limits.StreamIdle, o.close)
	defer idle.stop()
	done := make(chan int64, 1)
	src := x.upgradeSource(idle.reader(c.br), resp.Header.Get("Upgrade"))
	go func() {
		n, err := io.Copy(up, src)
		if err != nil { // the other direction ends too
			c.nc.Close()
			up.Close()
		}
		done <- n
	}()
	n, _ := io.Copy(&clientWriter{Conn: c.nc, d: c.s.Snapshot().Limits.ClientWrite}, idle.reader(up))
	c.nc.Close()
	up.Close()
	rec.BytesOut += n
	rec.BytesIn += <-done
}

// relay copies src to dst until src ends (nil) or fails, and holds a buffer only
// while bytes are in flight: it waits for src on the runtime's poller with nothing
// borrowed, takes a pooled buffer for each read, and returns it before waiting
// again. An idle tunnel therefore costs its two sockets and two goroutines, no
// buffer and no pipe. (io.Copy between TCP connections splices, and Go's splice
// keeps a pipe, two file descriptors, for as long as it waits for data: 6 fds per
// idle tunnel instead of 2, and 10,000 idle tunnels would need 60,000 fds.)
// The syscalls per message are those of a splice: one read, one write, and the
// read that finds nothing and parks.
func relay(dst io.Writer, src net.Conn) (int64, error) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return io.Copy(dst, src)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return io.Copy(dst, src)
	}
	var total int64
	for {
		bp, n, err := readRaw(raw)
		if n > 0 {
			_, werr := dst.Write((*bp)[:n])
			total += int64(n)
			if werr != nil {
				copyBufs.Put(bp)
				return total, &writeError{werr}
			}
		}
		if bp != nil {
			copyBufs.Put(bp)
		}
		switch {
		case err != nil:
			return total, err
		case n == 0:
			return total, nil // EOF
		}
	}
}

// readRaw reads what src has into a pooled buffer, waiting on the poller (within
// src's read deadline) while there is nothing. bp is nil when nothing was read.
func readRaw(raw syscall.RawConn) (bp *[]byte, n int, err error) {
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		bp = copyBufs.Get().(*[]byte)
		for {
			n, rerr = unix.Read(int(fd), *bp)
			if !errors.Is(rerr, unix.EINTR) {
				break
			}
		}
		if errors.Is(rerr, unix.EAGAIN) {
			copyBufs.Put(bp)
			bp, n = nil, 0
			return false // park until readable, holding nothing
		}
		return true
	})
	if err == nil && rerr != nil {
		err = rerr
	}
	if n < 0 {
		n = 0
	}
	return bp, n, err
}

// writeError is a failed write to relay's destination. It hides the cause's
// Timeout: a write that timed out (a client that reads nothing for
// limits.client_write) ends the tunnel, where a read that timed out only asks
// whether the tunnel is idle.
type writeError struct{ err error }

func (e *writeError) Error() string { return "write: " + e.err.Error() }

// A spliced tunnel or an upgraded connection (WebSocket, any 101) outlives the
// decision that admitted it: no request of its own comes by to be decided again. So
// each one is registered while it is open, with what it was admitted for, and every
// change of state decides the open ones again with their admission's own checks and
// ends those the new state refuses: Swap (a reload) all of them, CredentialChanged
// those carrying the credential. Requests inside intercepted tunnels need none of
// this: each is decided on the Snapshot current when it arrives.

// detailPolicyReload is the detail of an open tunnel or upgraded connection ended
// because the state changed under it: after a reload, a policy change or a
// credential revocation, the new state refuses it (docs/reasons.md).
const detailPolicyReload = "policy_reload"

// openConn is one open spliced tunnel or upgraded connection.
type openConn struct {
	target allowlist.Target
	// scheme is DecideRequest's: "" for a tunnel, the request's for an upgrade
	// (a plain-http upgrade is refused where the entry injects).
	scheme string
	// sniless marks a transparent tunnel without SNI: its target is the original
	// destination, which only an entry naming the address allows (namesAddress).
	sniless bool
	// upstream is the address dialled, which the address guard judges again;
	// invalid when unknown.
	upstream netip.AddrPort
	// credential is the ID whose value an upgrade carries; "" for none.
	credential string
	// close closes both sides; the connection's goroutine then logs its Record.
	close func()
	// cut is why the connection was ended, set once, before close.
	cut atomic.Pointer[refusal]
}

// decide decides o again on snap, with the checks that admitted it: the policy on its
// target and port (and scheme), an entry naming the address for a tunnel without
// SNI, the address guard on the address dialled, and the credential it carries. It
// returns the refusal, with detail policy_reload, or nil to keep o.
func (o *openConn) decide(snap *Snapshot) *refusal {
	d := snap.Policy.DecideRequest(o.target, o.scheme)
	switch {
	case !d.Allowed():
		return changed(deny(d.Reason, ""))
	case o.sniless && !namesAddress(d):
		return changed(deny(allowlist.ReasonNotAllowlisted, ""))
	}
	if o.upstream.IsValid() {
		if err := snap.Guard.Check(o.upstream); err != nil {
			return changed(classify(err))
		}
	}
	if o.credential != "" {
		if err := snap.credentialError(o.credential); err != nil {
			return changed(classify(err))
		}
	}
	return nil
}

// changed is rf as the refusal of a connection the state changed under.
func changed(rf *refusal) *refusal {
	return &refusal{Reason: rf.Reason, Detail: detailPolicyReload, Err: rf.Err}
}

// end records why o ends and closes it; only the first end counts. Closing runs
// apart, so that no peer that reads nothing can hold the change of state up (a TLS
// close_notify may wait for it).
func (o *openConn) end(rf *refusal) {
	if o.cut.CompareAndSwap(nil, rf) {
		go o.close()
	}
}

// ended writes on rec why o was ended, if it was: the new state's reason, detail
// policy_reload. Call it once both directions are done.
func (o *openConn) ended(rec *Record) {
	if rf := o.cut.Load(); rf != nil {
		rec.refused(rf)
	}
}

// namesAddress reports whether d allows its target by an entry that names it, not
// by "*": what a transparent ClientHello without SNI needs, whose target is only
// the original destination address.
func namesAddress(d allowlist.Decision) bool { return d.Allowed() && d.Rule.Pattern != "*" }

// credentialError is why credential id cannot be served on snap now, or nil.
func (snap *Snapshot) credentialError(id string) error {
	creds := snap.Injector.Credentials()
	if creds == nil {
		return &credential.UnavailableError{ID: id, Cause: credential.CauseNeverRead}
	}
	_, err := creds.Get(id)
	return err
}

// upstreamAddr is the address a connection reached, from its net.Addr, or invalid.
func upstreamAddr(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}

// resolvedAddr is the address an upgrade's request was sent to: the IP the record
// names on the target's port, or invalid when it names none.
func resolvedAddr(rec *Record, port uint16) netip.AddrPort {
	ip, err := netip.ParseAddr(rec.ResolvedIP)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip, port)
}

// register keeps o among the open connections until unregister, and decides it at
// once on the current Snapshot: a Swap or a revocation between its admission and now
// did not see it. Either that pass sees o, or o sees what that pass installed.
func (s *Server) register(o *openConn) {
	s.live.add(o)
	if rf := o.decide(s.Snapshot()); rf != nil {
		o.end(rf)
	}
}

func (s *Server) unregister(o *openConn) { s.live.remove(o) }

// redecide decides every open connection again on snap and ends those it refuses.
// It returns how many were open and how many it ended.
func (s *Server) redecide(snap *Snapshot) (open, ended int) {
	all := s.live.list("")
	for _, o := range all {
		if rf := o.decide(snap); rf != nil {
			o.end(rf)
			ended++
		}
	}
	return len(all), ended
}

// CredentialChanged ends the open upgraded connections that carry credential id
// when it can no longer be served (revoked, removed, stale): they are refused as a
// new request would be (credential_unavailable, detail policy_reload). The
// credential store calls it after every read of id (credential.Store.Subscribe);
// a credential that can be served costs one lookup.
func (s *Server) CredentialChanged(id string) {
	err := s.Snapshot().credentialError(id)
	if err == nil {
		return
	}
	rf := changed(classify(err))
	for _, o := range s.live.list(id) {
		o.end(rf)
	}
}

// openSet is the Server's open tunnels and upgraded connections.
type openSet struct {
	mu sync.Mutex
	m  map[*openConn]struct{}
}

func (s *openSet) add(o *openConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*openConn]struct{}{}
	}
	s.m[o] = struct{}{}
}

func (s *openSet) remove(o *openConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, o)
}

// list returns the open connections that carry credential id, or all when id is "".
func (s *openSet) list(id string) []*openConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*openConn, 0, len(s.m))
	for o := range s.m {
		if id == "" || o.credential == id {
			out = append(out, o)
		}
	}
	return out
}

func (s *openSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
