package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/hooks"
)

// serveIntercepted terminates the client's TLS with a leaf for the CONNECT target
// (never for a name the client sends later) and serves the requests inside over
// HTTP/2 or HTTP/1.1, as ALPN says. Each request is decided again, against the
// target, on the Runtime current when it arrives.
func (c *conn) serveIntercepted(rt *Runtime, t allowlist.Target, hello *clientHello, rec *Record) {
	rec.Intercepted = true
	if rt.Leaves == nil {
		rec.fail(allowlist.ReasonUpstreamTLS, "no_ca")
		rec.Error = "interception needed but no CA is configured"
		return
	}
	c.tunneling.Store(true)
	c.s.metrics.TunnelsActive.Inc()
	defer c.s.metrics.TunnelsActive.Dec()
	client := &replayConn{Conn: c.nc, r: io.MultiReader(bytes.NewReader(hello.raw), c.br)}
	tc := tls.Server(client, rt.Leaves.ServerConfigFor(c.nc.RemoteAddr(), t.Host, []string{"h2", "http/1.1"}))
	tc.SetDeadline(time.Now().Add(rt.Limits.ReadHeader))
	if err := tc.HandshakeContext(c.ctx); err != nil {
		detail, msg := clientTLSFailure(err, client.wrote, t.Host)
		rec.fail(allowlist.ReasonBadRequest, detail)
		rec.Error = msg
		return
	}
	tc.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		c.serveH2(rt, tc, t)
		return
	}
	inner := newConn(c.s, c.l, tc)
	inner.pinned, inner.refuseAll = &t, c.refuseAll
	inner.slot, inner.lane, inner.cutCtx, inner.laneRoot = c.slot, c.lane, c.cutCtx, c.laneRoot
	inner.ctx, inner.cancel = context.WithCancel(c.ctx) // the outer's end (or cut) ends it
	if c.s.trackConn(inner, true) {
		defer c.s.trackConn(inner, false)
		inner.serve()
	}
}

// detailUntrustedCA is the detail of a handshake the client ended because it does
// not trust egressd's certificate.
const detailUntrustedCA = "client_untrusted_ca"

// clientTLSFailure is the detail and log error of a failed handshake with the client.
// A client that rejects egressd's leaf (alert unknown_ca, bad_certificate,
// certificate_unknown or unsupported_certificate, or a close or an undecryptable
// record right after egressd's ServerHello) does not trust egressd's CA: the log says
// so and names the fix, rather than reading as corruption.
func clientTLSFailure(err error, serverSpoke bool, host string) (detail, msg string) {
	if !rejectedLeaf(err, serverSpoke) {
		return "client_tls", err.Error()
	}
	return detailUntrustedCA, err.Error() + ": the client rejected egressd's certificate for " + host +
		"; make the sandbox trust egressd's CA: run `egressd ca env` and export what it prints in the sandbox"
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

// serveH2 serves an intercepted HTTP/2 connection until it ends, with net/http's
// own HTTP/2 server (x/net/http2's server is deprecated in its favour).
func (c *conn) serveH2(rt *Runtime, tc *tls.Conn, t allowlist.Target) {
	ln := newOneConnListener(tc)
	srv := &http.Server{
		Handler:           &h2Handler{c: c, target: t},
		ReadHeaderTimeout: rt.Limits.ReadHeader,
		IdleTimeout:       rt.Limits.ClientIdle,
		MaxHeaderBytes:    rt.Limits.MaxHeaderBytes,
		HTTP2:             h2Config(rt),
		ErrorLog:          log.New(io.Discard, "", 0),
		// OPTIONS * is the pipeline's to decide (method_not_allowed where injected,
		// forwarded elsewhere), not net/http's to answer 200.
		DisableGeneralOptionsHandler: true,
		BaseContext:                  func(net.Listener) context.Context { return c.ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	go func() {
		<-ln.done
		srv.Close()
	}()
	srv.Serve(ln)
}

// HTTP/2 limits of an intercepted connection, sized so that one connection cannot
// pin more than a few MiB whatever its client sends:
//   - h2MaxStreams concurrent streams (RFC 9113 §6.5.2 recommends no fewer than 100),
//     each a goroutine and a request head of at most limits.max_header_bytes:
//     100 x (64 KiB + ~8 KiB) ~ 7 MiB at the default limits, in the worst case;
//   - h2ConnWindow bytes of request body received and not yet read, over all its
//     streams (flow control: the client may not send more), h2StreamWindow per
//     stream; hook bodies, which egressd reads itself, are bounded process-wide by
//     limits.hook_buffer_bytes instead;
//   - frames of at most h2MaxFrame bytes (the protocol's default and minimum), so
//     the frame buffer stays small.
//
// Writes may wait limits.client_write for the client, reads of a stream's body
// limits.read_header (h2Handler), a hook body the hook's deadline.
const (
	h2MaxStreams   = 100
	h2ConnWindow   = 1 << 20
	h2StreamWindow = 256 << 10
	h2MaxFrame     = 16 << 10
)

func h2Config(rt *Runtime) *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          h2MaxStreams,
		MaxReadFrameSize:              h2MaxFrame,
		MaxReceiveBufferPerConnection: h2ConnWindow,
		MaxReceiveBufferPerStream:     h2StreamWindow,
		WriteByteTimeout:              rt.Limits.ClientWrite,
	}
}

// oneConnListener hands net/http's server a single, already terminated connection.
// The connection must stay a *tls.Conn (net/http finds HTTP/2 by that type), so its
// end is learnt from the server's ConnState.
type oneConnListener struct {
	conn chan net.Conn
	done chan struct{}
	addr net.Addr
	once sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{conn: make(chan net.Conn, 1), done: make(chan struct{}), addr: c.LocalAddr()}
	l.conn <- c
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conn:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *oneConnListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.addr }

// h2Handler serves the streams of one intercepted HTTP/2 connection.
type h2Handler struct {
	c      *conn
	target allowlist.Target
}

func (h *h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.c.streams.Add(1)
	defer h.c.streams.Add(-1)
	rt := h.c.s.Runtime()
	rec := newRecord(h.c.l, h.c.nc.RemoteAddr())
	defer rec.finish(&h.c.s.log, h.c.s.metrics)
	x := newExchange(h.c, rt, r, rec, &h.target)
	defer x.body.Close()
	rc := http.NewResponseController(w)
	x.body.deadline = &bodyDeadline{set: rc.SetReadDeadline, perRead: rt.Limits.ReadHeader}
	m, ok := x.hookMatch(h.c.l.cfg.Role)
	if h.c.lane && !(ok && m.Event == hooks.EventPre) {
		writeRefusalRW(w, rt, rec, laneRefusal())
		return
	}
	if ok {
		resp, err := x.serveHook(r.Context(), m, h.c.refuseAll)
		rec.BytesIn = x.body.n.Load()
		if err == nil {
			writeResponseRW(w, x.scrubbed(resp), rec)
		} else {
			writeRefusalRW(w, rt, rec, err)
		}
		return
	}
	if h.c.refuseAll != nil {
		rec.Path, rec.Scheme, rec.Intercepted = r.URL.Path, "https", true
		rec.setTarget(h.target)
		w.Header().Set("Connection", "close") // net/http: GOAWAY, then close
		writeRefusalRW(w, rt, rec, h.c.refuseAll)
		return
	}
	out, err := x.prepare(r.Context())
	if err == nil {
		var resp *http.Response
		if resp, err = rt.roundTrip(out, rec); err == nil {
			resp = x.scrubbed(resp)
			defer resp.Body.Close()
			rec.BytesIn = x.body.n.Load()
			writeResponseRW(w, resp, rec)
			return
		}
	}
	rec.BytesIn = x.body.n.Load()
	if bodyErr := x.body.clientError(); bodyErr != nil {
		err = bodyErr
	}
	writeRefusalRW(w, rt, rec, err)
}

// writeRefusalRW writes a refusal through an http.ResponseWriter.
func writeRefusalRW(w http.ResponseWriter, rt *Runtime, rec *Record, err error) {
	code, hdr, body := refusalFor(rt, rec, err, 0)
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
	n, _ := w.Write(body)
	rec.BytesOut += int64(n)
}

// writeResponseRW streams resp through an http.ResponseWriter (the HTTP/2 side),
// flushing after every read, then sets every trailer the upstream sent, announced
// in a Trailer header or not (gRPC never announces grpc-status): net/http fills
// resp.Trailer when the body ends, and http.TrailerPrefix sends a trailer nobody
// declared.
func writeResponseRW(w http.ResponseWriter, resp *http.Response, rec *Record) {
	rec.Status = resp.StatusCode
	removeHopByHop(resp.Header)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	n, err := streamBody(resp.Body, func(p []byte) error { _, err := w.Write(p); return err }, rc.Flush)
	rec.BytesOut += n
	if err != nil && !errors.Is(err, io.EOF) {
		rec.Error = err.Error()
		return
	}
	removeEgressdHeaders(resp.Trailer)
	for k, v := range resp.Trailer {
		h[http.TrailerPrefix+k] = v
	}
}
