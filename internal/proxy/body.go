package proxy

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/egressd/egressd/internal/inject"
)

// requestBody is the client's request body as the transport reads it. Close does not
// touch the client connection (net/http's body would drain it without bound), nor wait
// for a read in flight (a placeholder search may leave one pending: it ends with the
// client's next bytes or its deadline); drain, called by the connection loop, reads
// what is left within a bound.
type requestBody struct {
	mu     sync.Mutex
	r      io.Reader
	n      atomic.Int64
	closed atomic.Bool
	eof    bool
	onEOF  func() // runs once, when the body has been read to its end
	// deadline, when set, is armed before each read of the client's body, so a
	// client that stops sending its body mid-way cannot hold the connection (and
	// an upstream one) forever (server.go).
	deadline *bodyDeadline
	// sendContinue, when set, runs once before the first read: it answers the
	// client's Expect: 100-continue, so that the client sends the body egressd
	// is about to read instead of waiting for a 100 first.
	sendContinue func()
	readErr      error // the first error reading the client's body, other than EOF
}

// maxDrain is how much of an unread request body is read to keep the connection.
const maxDrain = 256 << 10

func newRequestBody(req *http.Request) *requestBody {
	if req.Body == nil || req.Body == http.NoBody {
		return &requestBody{r: http.NoBody, eof: true}
	}
	return &requestBody{r: req.Body}
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.sendContinue != nil {
		b.sendContinue()
		b.sendContinue = nil
	}
	b.deadline.arm()
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	if err != nil && err != io.EOF && b.readErr == nil {
		b.readErr = err
	}
	if err == io.EOF && !b.eof {
		b.eof = true
		if b.onEOF != nil {
			b.onEOF()
		}
	}
	return n, err
}

// clientError is the error that reading the client's body ended with, if any: a
// forward that failed because of it is the client's bad request (a malformed chunk,
// a body cut short, a stalled upload), not an upstream failure.
func (b *requestBody) clientError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.readErr == nil {
		return nil
	}
	if isTimeout(b.readErr) {
		return badRequest("body_timeout", b.readErr)
	}
	return badRequest("malformed_body", b.readErr)
}

func (b *requestBody) Close() error {
	b.closed.Store(true)
	return nil
}

// Rewind undoes a transport's Close when nothing has been read: a request that
// failed before any of its body was sent may be sent again (upstream.Rewinder).
func (b *requestBody) Rewind() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n.Load() != 0 || b.readErr != nil {
		return false
	}
	b.closed.Store(false)
	return true
}

// drain reads the rest of the body, up to maxDrain, and reports whether the
// connection's framing is intact for another request.
func (b *requestBody) drain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed.Store(true)
	if b.eof {
		return true
	}
	b.deadline.arm()
	_, err := io.CopyN(io.Discard, b.r, maxDrain)
	return err == io.EOF
}

// trailers arranges for the client's request trailers to reach the upstream without
// any injected name and without Egressd-* or hop-by-hop fields. The declared names
// are filtered now (HTTP/2 upstreams announce trailers with the request head) and
// the values when the body ends, which is when the transport writes them.
func (b *requestBody) trailers(in, out *http.Request, injected []string) {
	if in.Trailer == nil {
		out.Trailer = nil
		return
	}
	out.Trailer = filterTrailer(in.Trailer, injected)
	b.onEOF = func() {
		clear(out.Trailer)
		for k, v := range filterTrailer(in.Trailer, injected) {
			out.Trailer[k] = v
		}
	}
}

// filterTrailer copies t without the injected names and the fields only egressd or
// the connection may set.
func filterTrailer(t http.Header, injected []string) http.Header {
	out := t.Clone()
	for _, name := range injected {
		inject.Remove(out, name)
	}
	removeHopByHop(out)
	removeEgressdHeaders(out)
	return out
}
