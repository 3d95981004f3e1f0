package proxy

import (
	"context"
	"io"
	"math"
	"net"
	"sync/atomic"
	"time"
)

// Every read from and write to a client has a deadline, so that no client can hold
// a connection slot, a goroutine or a buffer by going quiet (docs/hooks.md: the
// paragraph on attacks):
//
//   - request heads: limits.read_header (conn.nextRequest);
//   - request bodies: limits.read_header per read, HTTP/1 and HTTP/2 alike, until
//     they are forwarded, then limits.stream_idle; a hook call's whole body: the
//     hook's own deadline (bodyDeadline);
//   - upgraded connections: limits.stream_idle without a byte either way (idleWatch);
//   - writes: limits.client_write per write (clientWriter), HTTP/2 included
//     (http.HTTP2Config.WriteByteTimeout), tunnels and upgrades too.

// clientWriter is the client side of a connection for writing: every write may
// wait at most d for the client to take the bytes. A client that pipelines
// requests and never reads their answers is closed after d instead of holding its
// slot forever. Reads and everything else go to the embedded connection.
type clientWriter struct {
	net.Conn
	d time.Duration
}

func (w *clientWriter) Write(p []byte) (int, error) {
	w.Conn.SetWriteDeadline(time.Now().Add(w.d))
	return w.Conn.Write(p)
}

// CloseWrite half-closes the connection when it can (a tunnel's end of input).
func (w *clientWriter) CloseWrite() error {
	if cw, ok := w.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return w.Conn.Close()
}

// bodyDeadline arms the read deadline of a client's request body: per read by
// default, or one deadline for the whole body (a hook call, which egressd reads
// itself and must answer within the hook's timeout). expire ends every wait at
// once and for good: the hook's deadline passed or the call was cut short.
type bodyDeadline struct {
	set     func(time.Time) error // the connection's or stream's read deadline
	perRead time.Duration
	until   time.Time // when set, the deadline of the whole body
	expired atomic.Bool
}

// forwarding lengthens each later read's wait to idle (limits.stream_idle) once the
// body is being streamed to the upstream: a forwarded stream (a bidirectional gRPC
// call, a long upload) that is merely quiet is not cut by the deadline meant for
// heads and for bodies egressd reads itself. A whole-body deadline (a hook call's)
// stays. Call it before the transport reads the body.
func (d *bodyDeadline) forwarding(idle time.Duration) {
	if d != nil && d.until.IsZero() {
		d.perRead = idle
	}
}

// expiredDeadline is a deadline in the past: a read with it fails at once.
var expiredDeadline = time.Unix(1, 0)

// arm sets the deadline for the next read. A concurrent expire wins: it is
// checked again after the deadline is set.
func (d *bodyDeadline) arm() {
	if d == nil || d.set == nil {
		return
	}
	next := time.Now().Add(d.perRead)
	if !d.until.IsZero() {
		next = d.until
	}
	if d.expired.Load() {
		next = expiredDeadline
	}
	d.set(next)
	if d.expired.Load() {
		d.set(expiredDeadline)
	}
}

// expire makes the current and every later read fail with a timeout. It may run
// on any goroutine, while a read waits.
func (d *bodyDeadline) expire() {
	if d == nil || d.set == nil {
		return
	}
	d.expired.Store(true)
	d.set(expiredDeadline)
}

// expireOn runs expire when ctx ends and returns the function that disarms it.
// That function waits for an expire already under way, so nothing touches the
// connection or the HTTP/2 stream once the caller has returned: after an HTTP/2
// handler ends, its stream's deadline setter must never run again (net/http
// would dereference a released stream and crash the process).
func (d *bodyDeadline) expireOn(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	disarm := context.AfterFunc(ctx, func() {
		defer close(done)
		d.expire()
	})
	return func() {
		if !disarm() {
			<-done
		}
	}
}

// idleWatch ends an upgraded connection once neither direction has moved a byte
// for d: one timer, re-armed for what is left of d whenever it fires early, and a
// timestamp each read with data moves forward.
type idleWatch struct {
	last  atomic.Int64 // UnixNano of the last byte either way
	d     time.Duration
	timer *time.Timer
}

func watchIdle(d time.Duration, end func()) *idleWatch {
	w := &idleWatch{d: d}
	w.last.Store(time.Now().UnixNano())
	w.timer = time.AfterFunc(math.MaxInt64, func() { // armed below, once w.timer is set
		if left := d - time.Since(time.Unix(0, w.last.Load())); left > 0 {
			w.timer.Reset(left)
			return
		}
		end()
	})
	w.timer.Reset(d)
	return w
}

func (w *idleWatch) stop() { w.timer.Stop() }

// reader is r, marking w active on every read that returns data.
func (w *idleWatch) reader(r io.Reader) io.Reader { return activityReader{r, w} }

type activityReader struct {
	r io.Reader
	w *idleWatch
}

func (a activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.w.last.Store(time.Now().UnixNano())
	}
	return n, err
}
