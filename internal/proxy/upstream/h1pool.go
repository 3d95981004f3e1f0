package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
)

// h1Pool sends the commonest request, an HTTP/1.1 GET or HEAD without a body, to
// its upstream on the calling goroutine, over keep-alive connections of its own.
// Every other request (bodies, upgrades, HTTP/2 clients) goes through net/http's
// Transport. The request and response bytes are net/http's own: Request.Write
// frames the request and ReadResponse parses the answer, exactly as the Transport
// does; what the pool leaves out is the Transport's per-request machinery (a
// writer and a reader goroutine per connection, three goroutine hand-offs, the
// cancellation and idle-queue bookkeeping), which took a large share of egressd's
// CPU on the plain and intercepted GET paths (a CPU profile of make bench shows
// them).
//
// Connections are keyed by scheme and decided target, dialled through the
// Client's guarded dialer, verified with the upstream TLS policy, and reused only
// when the previous response was read to its end, neither side asked to close, and
// nothing arrived on the connection while it was idle (quiet). Where it behaves
// as the Transport does and where not, and why, is h1pool_diff_test.go's table.
type h1Pool struct {
	// What the pool needs of its Client, handed over by newH1Pool.
	dialTarget     func(context.Context, allowlist.Target) (net.Conn, error) // guarded (client.go)
	tlsConfig      func() *tls.Config                                        // the upstream TLS policy, a fresh copy
	dialTimeout    time.Duration                                             // limits.dial, for the TLS handshake
	responseHeader time.Duration                                             // limits.response_header
	upstreamIdle   time.Duration                                             // how long an idle connection is kept
	maxHead        int64                                                     // limits.max_header_bytes, for response heads

	mu        sync.Mutex
	idle      map[h1Key][]*h1Conn // most recently used last
	lastSweep time.Time
	closed    bool
}

// newH1Pool is the pool of c's upstream HTTP/1.1 connections.
func newH1Pool(c *Client) *h1Pool {
	return &h1Pool{dialTarget: c.Dial, tlsConfig: c.tlsConfig, dialTimeout: c.o.Limits.Dial,
		responseHeader: c.o.Limits.ResponseHeader, upstreamIdle: c.o.Limits.UpstreamIdle, maxHead: c.maxResponseHead(),
		idle: map[h1Key][]*h1Conn{}}
}

type h1Key struct{ scheme, addr string }

// h1Conn is one upstream connection.
type h1Conn struct {
	key    h1Key
	nc     net.Conn
	lr     io.LimitedReader // nc, bounded to the pool's maxHead while a head is read
	br     *bufio.Reader    // over lr
	bw     *bufio.Writer
	idleAt time.Time
	// alpnDeclined: the TLS handshake confirmed no ALPN protocol.
	alpnDeclined bool
}

// maxIdlePerTarget bounds the idle connections kept per upstream, as the
// Transport's MaxIdleConnsPerHost does.
const maxIdlePerTarget = 256

// h1Eligible reports whether out may take the pool's path: an HTTP/1.x client's
// GET or HEAD with no body, no trailers and no upgrade, so that writing it never
// waits for the client and a failure before any answer can be retried.
func h1Eligible(out *http.Request) bool {
	return out.ProtoMajor == 1 && (out.Method == http.MethodGet || out.Method == http.MethodHead) &&
		out.Body == http.NoBody && len(out.Trailer) == 0 && len(out.Header["Upgrade"]) == 0
}

// roundTrip sends out and returns the response, whose Body returns the connection
// to the pool once read to its end (or closes it). A reused connection that fails
// before any response byte (the upstream closed it after the quiet check) is
// replaced, as the Transport replaces it: by the next idle one, else a new one.
// Cancelling out's context ends every wait on the connection, body reads included.
func (p *h1Pool) roundTrip(out *http.Request) (*http.Response, error) {
	if err := validHeader(out.Header); err != nil {
		return nil, err
	}
	key := h1Key{out.URL.Scheme, out.URL.Host}
	ctx := out.Context()
	for {
		pc, reused, err := p.conn(ctx, key, out.URL.Hostname())
		if err != nil {
			return nil, err
		}
		if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: pc.nc, Reused: reused})
		}
		stop := context.AfterFunc(ctx, func() { pc.nc.SetDeadline(expiredDeadline) })
		resp, err := pc.exchange(out, p.responseHeader, p.maxHead)
		if err == nil && ctx.Err() == nil {
			resp.Body = p.track(pc, resp, out, stop)
			return resp, nil
		}
		stop()
		pc.nc.Close()
		if err == nil {
			return nil, ctx.Err()
		}
		if !reused && pc.alpnDeclined && errors.Is(err, errNothingRead) {
			return nil, fmt.Errorf("%w: %w", errUnanswered, err) // perhaps HTTP/2 only (client.go)
		}
		if !reused || !errors.Is(err, errNothingRead) {
			return nil, err
		}
	}
}

// conn takes an idle connection for key, or dials one; reused tells which.
func (p *h1Pool) conn(ctx context.Context, key h1Key, serverName string) (pc *h1Conn, reused bool, err error) {
	if pc = p.get(key); pc != nil {
		return pc, true, nil
	}
	pc, err = p.dial(ctx, key, serverName)
	return pc, false, err
}

// validHeader refuses what net/http's Transport refuses before it sends anything:
// a header name that is not a token, or a value with a line break or another
// control character (Request.Write, which the pool uses, checks neither). A value
// that could split the head, from a client, a transform or a credential (a PEM key
// named by an entry), never reaches the upstream. The error names the header,
// never its value.
func validHeader(h http.Header) error {
	for name, values := range h {
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("invalid header field name %q", name)
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("invalid header field value for %q", name)
			}
		}
	}
	return nil
}

// errNothingRead marks a failure before any byte of a response arrived.
var errNothingRead = errors.New("upstream closed the connection before answering")

// exchange writes out and reads the response head within headerTimeout and
// maxHead bytes, skipping 1xx interim responses.
func (pc *h1Conn) exchange(out *http.Request, headerTimeout time.Duration, maxHead int64) (*http.Response, error) {
	if err := out.Write(pc.bw); err != nil {
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	if err := pc.bw.Flush(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	pc.nc.SetReadDeadline(time.Now().Add(headerTimeout))
	defer pc.nc.SetReadDeadline(time.Time{})
	pc.lr.N = maxHead
	defer func() { pc.lr.N = math.MaxInt64 }()
	if _, err := pc.br.Peek(1); err != nil {
		if isTimeout(err) {
			return nil, &timeoutError{err}
		}
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	for {
		resp, err := http.ReadResponse(pc.br, out)
		switch {
		case err != nil && pc.lr.N <= 0:
			return nil, fmt.Errorf("upstream response headers exceeded %d bytes", maxHead)
		case err != nil && isTimeout(err):
			return nil, &timeoutError{err}
		case err != nil:
			return nil, err
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, ErrSwitched // the pool carries no Upgrade
		case resp.StatusCode < 100: // no status line a client could be sent
			return nil, fmt.Errorf("upstream sent status code %03d", resp.StatusCode)
		case resp.StatusCode >= 200:
			return resp, nil
		}
	}
}

// timeoutError is an upstream that did not answer within limits.response_header.
type timeoutError struct{ err error }

func (e *timeoutError) Error() string { return "timeout awaiting response headers: " + e.err.Error() }
func (e *timeoutError) Unwrap() error { return e.err }
func (e *timeoutError) Timeout() bool { return true }

// track wraps resp.Body so the connection goes back to the pool when the body has
// been read to its end and may carry another request, and is closed otherwise.
// stop unregisters the cancellation of the connection's waits.
func (p *h1Pool) track(pc *h1Conn, resp *http.Response, out *http.Request, stop func() bool) io.ReadCloser {
	b := &h1Body{p: p, pc: pc, body: resp.Body, reusable: !resp.Close && !out.Close, stop: stop}
	if resp.Body == http.NoBody {
		b.finish(true)
		return http.NoBody
	}
	return b
}

type h1Body struct {
	p        *h1Pool
	pc       *h1Conn
	body     io.ReadCloser
	reusable bool
	stop     func() bool
	done     bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.finish(false)
	return nil
}

// finish hands the connection back (atEOF, and not cancelled meanwhile) or closes
// it (a body not read to its end).
func (b *h1Body) finish(atEOF bool) {
	if b.done {
		return
	}
	b.done = true
	cancelled := !b.stop()
	b.p.release(b.pc, atEOF && b.reusable && !cancelled)
}

// release returns pc to the idle pool, or closes it when it may not be reused.
func (p *h1Pool) release(pc *h1Conn, reusable bool) {
	if !reusable || pc.br.Buffered() > 0 { // bytes beyond the response: not to be trusted
		pc.nc.Close()
		return
	}
	now := time.Now()
	pc.idleAt = now
	p.mu.Lock()
	if p.closed || len(p.idle[pc.key]) >= maxIdlePerTarget {
		p.mu.Unlock()
		pc.nc.Close()
		return
	}
	p.idle[pc.key] = append(p.idle[pc.key], pc)
	stale := p.sweepLocked(now)
	p.mu.Unlock()
	for _, s := range stale {
		s.nc.Close()
	}
}

// get takes the most recently used idle connection for key that has not idled
// past limits.upstream_idle and is quiet.
func (p *h1Pool) get(key h1Key) *h1Conn {
	for {
		pc := p.pop(key)
		if pc == nil || pc.quiet() {
			return pc
		}
		pc.nc.Close()
	}
}

func (p *h1Pool) pop(key h1Key) *h1Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := p.idle[key]
	for len(conns) > 0 {
		pc := conns[len(conns)-1]
		conns = conns[:len(conns)-1]
		if time.Since(pc.idleAt) < p.upstreamIdle {
			p.idle[key] = conns
			return pc
		}
		pc.nc.Close()
	}
	delete(p.idle, key)
	return nil
}

// quiet reports whether nothing arrived on an idle connection: neither the
// upstream's close nor bytes no request asked for (a body sent after a 204 or a
// HEAD's head, a 408), which would be read as the next request's response. The
// Transport learns the same from the reader it keeps on every idle connection;
// the pool looks once, when it takes one: what TLS has buffered, then the socket.
func (pc *h1Conn) quiet() bool {
	pc.nc.SetReadDeadline(expiredDeadline)
	_, err := pc.br.Peek(1)
	pc.nc.SetReadDeadline(time.Time{})
	return isTimeout(err) && socketQuiet(pc.nc)
}

// socketQuiet reports whether nc's socket has nothing to read and is not closed,
// without reading: one non-blocking MSG_PEEK.
func socketQuiet(nc net.Conn) bool {
	raw := nc
	if tc, ok := raw.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return true // nothing to look at: a failure before any answer is retried
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var peekErr error
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, peekErr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false
	}
	return errors.Is(peekErr, unix.EAGAIN)
}

// sweepLocked takes the connections that idled past limits.upstream_idle out of the pool,
// at most once every sweepEvery, for the caller to close outside the lock.
func (p *h1Pool) sweepLocked(now time.Time) []*h1Conn {
	const sweepEvery = 10 * time.Second
	if now.Sub(p.lastSweep) < sweepEvery {
		return nil
	}
	p.lastSweep = now
	var stale []*h1Conn
	for key, conns := range p.idle {
		kept := conns[:0]
		for _, pc := range conns {
			if now.Sub(pc.idleAt) < p.upstreamIdle {
				kept = append(kept, pc)
			} else {
				stale = append(stale, pc)
			}
		}
		if len(kept) == 0 {
			delete(p.idle, key)
		} else {
			p.idle[key] = kept
		}
	}
	return stale
}

// dial connects to the decided target (in ctx) through the guarded dialer and, for https,
// verifies the upstream with the upstream TLS policy for serverName.
func (p *h1Pool) dial(ctx context.Context, key h1Key, serverName string) (*h1Conn, error) {
	t, err := decidedTarget(ctx, key.addr)
	if err != nil {
		return nil, err
	}
	nc, err := p.dialTarget(ctx, t)
	if err != nil {
		return nil, err
	}
	declined := false
	if key.scheme == "https" {
		if nc, err = p.handshake(ctx, nc, serverName); err != nil {
			return nil, err
		}
		declined = nc.(*tls.Conn).ConnectionState().NegotiatedProtocol == ""
	}
	pc := &h1Conn{key: key, nc: nc, lr: io.LimitedReader{R: nc, N: math.MaxInt64}, bw: bufio.NewWriterSize(nc, 4096),
		alpnDeclined: declined}
	pc.br = bufio.NewReaderSize(&pc.lr, 4096)
	return pc, nil
}

func (p *h1Pool) handshake(ctx context.Context, nc net.Conn, serverName string) (net.Conn, error) {
	conf := p.tlsConfig()
	conf.ServerName = serverName
	conf.NextProtos = []string{"http/1.1"}
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	tc := tls.Client(nc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return tc, nil
}

// expiredDeadline is a deadline in the past: a wait with it ends at once.
var expiredDeadline = time.Unix(1, 0)

// closeIdle closes every idle connection; after it the pool keeps none.
func (p *h1Pool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, conns := range idle {
		for _, pc := range conns {
			pc.nc.Close()
		}
	}
}
