package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/time/rate"

	"github.com/egressd/egressd/internal/allowlist"
)

// detailStreamRate is the overloaded detail of a stream beyond h2StreamRate.
const detailStreamRate = "stream_rate"

// serveH2 serves an intercepted HTTP/2 connection until it ends, with net/http's
// own HTTP/2 server (x/net/http2's server is deprecated in its favour).
func (c *conn) serveH2(snap *Snapshot, tc *tls.Conn, via route) {
	ln := newOneConnListener(tc)
	srv := &http.Server{
		Handler:           &h2Handler{c: c, route: via, streams: rate.NewLimiter(h2StreamRate, h2StreamBurst)},
		ReadHeaderTimeout: snap.Limits.ReadHeader,
		IdleTimeout:       snap.Limits.ClientIdle,
		MaxHeaderBytes:    snap.Limits.MaxHeaderBytes,
		HTTP2:             h2Config(snap),
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
//     stream, which a stream with a body reserves from the memory budget
//     (holdStreamWindow); hook bodies, which egressd reads itself, are bounded
//     process-wide by limits.hook_buffer_bytes too;
//   - frames of at most h2MaxFrame bytes (the protocol's default and minimum), so
//     the frame buffer stays small.
//
// Writes may wait limits.client_write for the client, reads of a stream's body
// limits.read_header (h2Handler), a hook body the hook's deadline.
//
// New streams are admitted at h2StreamRate per second (bursts of h2StreamBurst);
// beyond it a stream is refused (overloaded, detail stream_rate) without being
// decided or forwarded, so a client that opens and resets streams as fast as it can
// (rapid reset) costs egressd a refusal per stream and the upstream nothing.
const (
	h2StreamRate   = 250
	h2StreamBurst  = 500
	h2MaxStreams   = 100
	h2ConnWindow   = 1 << 20
	h2StreamWindow = 256 << 10
	h2MaxFrame     = 16 << 10
)

func h2Config(snap *Snapshot) *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          h2MaxStreams,
		MaxReadFrameSize:              h2MaxFrame,
		MaxReceiveBufferPerConnection: h2ConnWindow,
		MaxReceiveBufferPerStream:     h2StreamWindow,
		WriteByteTimeout:              snap.Limits.ClientWrite,
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
	c       *conn // the outer connection
	route   route // modeTunnel or modeRefused
	streams *rate.Limiter
}

func (h *h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.c.streams.Add(1)
	defer h.c.streams.Add(-1)
	snap := h.c.s.Snapshot()
	rec := newRecord(h.c.l, h.c.nc.RemoteAddr())
	defer rec.finish(&h.c.s.log, h.c.s.metrics)
	x := newExchange(h.c, snap, r, rec, h.route)
	release, throttled := h.admit(snap, r)
	defer release()
	x.throttled = throttled
	rc := http.NewResponseController(w)
	x.body.deadline = &bodyDeadline{set: rc.SetReadDeadline, perRead: snap.Limits.ReadHeader}
	if h.c.lane {
		// A lane connection carries one call (server.go); net/http answers this
		// with a GOAWAY, so the runtime's next call takes a new connection
		// rather than racing the lane's cut of this one.
		w.Header().Set("Connection", "close")
	}
	serveRequest(r.Context(), x, h2Side{w})
}

// admit refuses a stream beyond the connection's rate of new streams, or one whose
// receive window the memory budget cannot hold (holdStreamWindow); release gives
// back what it reserved.
func (h *h2Handler) admit(snap *Snapshot, r *http.Request) (release func(), refused error) {
	if !h.streams.Allow() {
		return func() {}, deny(allowlist.ReasonOverloaded, detailStreamRate)
	}
	release, ok := holdStreamWindow(snap.mem, r)
	if !ok {
		return release, errH2Windows
	}
	return release, nil
}

// h2Side is the tail's client side on an HTTP/2 stream. net/http answers Expect:
// 100-continue itself, when the body is first read.
type h2Side struct{ w http.ResponseWriter }

func (h2Side) sendContinue() {}

// refuse writes the refusal as a complete HTTP/2 response; a gRPC call's also as a
// gRPC status. The connection stays: a GOAWAY sent with the response (net/http's
// answer to Connection: close) reads as a terminated connection to clients such as
// httpx, which then drop the response and its reason. Every later request in a
// refused tunnel is refused too.
func (s h2Side) refuse(x *exchange, err error) bool {
	if isGRPC(x.req) {
		writeGRPCRefusal(s.w, x.snap, x.rec, err)
		return false
	}
	writeRefusalRW(s.w, x.snap, x.rec, err)
	return false
}

func (s h2Side) respond(x *exchange, resp *http.Response) bool {
	writeResponseRW(s.w, resp, x.rec)
	return false
}

// writeRefusalRW writes a refusal through an http.ResponseWriter.
func writeRefusalRW(w http.ResponseWriter, snap *Snapshot, rec *Record, err error) {
	code, hdr, body := refusalFor(snap, rec, err, 0)
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
	n, _ := w.Write(body)
	rec.BytesOut += int64(n)
}

// gRPC status codes of egressd's refusals (grpc/codes).
const (
	grpcPermissionDenied = 7
	grpcUnavailable      = 14
)

// isGRPC reports whether req is a gRPC call (application/grpc, +proto and the like).
func isGRPC(req *http.Request) bool {
	return strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc")
}

// writeGRPCRefusal answers a gRPC call's refusal as gRPC clients read one: a
// Trailers-Only response (HTTP 200 with grpc-status and grpc-message in its head),
// PERMISSION_DENIED for a denial and UNAVAILABLE for a failure, the message naming
// the reason, so grpc.Code and status.Message show why. Egressd-Reason is set too.
func writeGRPCRefusal(w http.ResponseWriter, snap *Snapshot, rec *Record, err error) {
	rf := rec.refused(err)
	code := grpcUnavailable
	if rf.Reason.IsDenial() {
		code = grpcPermissionDenied
	}
	msg := "egressd: " + string(rf.Reason) + ": " + rf.Reason.Message(rec.Host, rec.Port, snap.Env, rf.Detail)
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Egressd-Reason", string(rf.Reason))
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", grpcPercentEncode(msg))
	w.WriteHeader(http.StatusOK)
	rec.Status = http.StatusOK
}

// grpcPercentEncode encodes a grpc-message value: every byte outside printable
// ASCII, and '%', as %XX (the gRPC over HTTP/2 protocol spec).
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
