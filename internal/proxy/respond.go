package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// copyBufs holds the buffers responses are streamed through.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writeHead writes a status line and header fields. Values reach here from net/http's
// parsers or from egressd itself, so they hold no CR or LF.
func writeHead(bw *bufio.Writer, code int, h http.Header, closeConn bool) {
	writeHeadPhrase(bw, code, http.StatusText(code), h, closeConn)
}

// writeHeadPhrase is writeHead with the status line's reason phrase given.
func writeHeadPhrase(bw *bufio.Writer, code int, phrase string, h http.Header, closeConn bool) {
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteByte(' ')
	bw.WriteString(phrase)
	bw.WriteString("\r\n")
	for name, values := range h {
		for _, v := range values {
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if closeConn {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// writeResponse streams resp to an HTTP/1.1 client, flushing after every read so
// server-sent events are never held back. It reports whether the connection may
// carry another request.
func writeResponse(bw *bufio.Writer, method string, wantClose bool, resp *http.Response, rec *Record) (bool, error) {
	rec.Status = resp.StatusCode
	removeHopByHop(resp.Header)
	bodyless := bodyless(method, resp.StatusCode)
	chunked := false
	switch {
	case bodyless:
	case resp.ContentLength >= 0:
		resp.Header["Content-Length"] = []string{strconv.FormatInt(resp.ContentLength, 10)}
	case !wantClose:
		chunked = true
		resp.Header["Transfer-Encoding"] = []string{"chunked"}
		removeEgressdHeaders(resp.Trailer)
		if len(resp.Trailer) > 0 {
			resp.Header["Trailer"] = []string{trailerNames(resp.Trailer)}
		}
	default:
		wantClose = true // close-delimited body
	}
	writeHead(bw, resp.StatusCode, resp.Header, wantClose)
	if bodyless {
		return !wantClose, bw.Flush()
	}
	n, err := copyBody(bw, resp.Body, chunked)
	rec.BytesOut += n
	if err != nil {
		return false, err
	}
	if chunked {
		// Every trailer the upstream sent, announced or not (net/http fills
		// resp.Trailer when the body ends), except the ones only egressd sets.
		removeEgressdHeaders(resp.Trailer)
		bw.WriteString("0\r\n")
		for name, values := range resp.Trailer {
			for _, v := range values {
				bw.WriteString(name + ": " + v + "\r\n")
			}
		}
		bw.WriteString("\r\n")
	}
	return !wantClose, bw.Flush()
}

// bodyless reports whether a response to method with status code has no body.
func bodyless(method string, code int) bool {
	return method == http.MethodHead || code/100 == 1 || code == http.StatusNoContent || code == http.StatusNotModified
}

func trailerNames(t http.Header) string {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// copyBody copies src to bw, chunk-encoded when chunked, flushing after each read.
func copyBody(bw *bufio.Writer, src io.Reader, chunked bool) (int64, error) {
	write := func(p []byte) error {
		_, err := bw.Write(p)
		return err
	}
	if chunked {
		write = func(p []byte) error {
			bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
			bw.WriteString("\r\n")
			bw.Write(p)
			_, err := bw.WriteString("\r\n")
			return err
		}
	}
	return streamBody(src, write, bw.Flush)
}

// streamBody copies src through write, flushing after every read so that nothing
// the upstream has sent waits in a buffer (server-sent events, long polls).
func streamBody(src io.Reader, write func([]byte) error, flush func() error) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if err := write(buf[:n]); err != nil {
				return total, err
			}
			if err := flush(); err != nil {
				return total, err
			}
			total += int64(n)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// requestBody is the client's request body as the transport reads it. Close does not
// touch the client connection (net/http's body would drain it without bound); drain,
// called by the connection loop, reads what is left within a bound.
type requestBody struct {
	mu     sync.Mutex
	r      io.Reader
	n      atomic.Int64
	closed bool
	eof    bool
	onEOF  func() // runs once, when the body has been read to its end
	// deadline, when set, is armed before each read of the client's body, so a
	// client that stops sending its body mid-way cannot hold the connection (and
	// an upstream one) forever (deadline.go).
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
	if b.closed {
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
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// reopen undoes a transport's Close when nothing has been read: a request that
// failed before any of its body was sent may be sent again.
func (b *requestBody) reopen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n.Load() != 0 || b.readErr != nil {
		return false
	}
	b.closed = false
	return true
}

// drain reads the rest of the body, up to maxDrain, and reports whether the
// connection's framing is intact for another request.
func (b *requestBody) drain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.eof {
		return true
	}
	b.deadline.arm()
	_, err := io.CopyN(io.Discard, b.r, maxDrain)
	return err == io.EOF
}

// badRequestFrom turns a request-parsing error into a bad_request refusal.
func badRequestFrom(err error) error {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf
	}
	return badRequest("malformed_request", err)
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}
