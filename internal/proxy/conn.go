package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/membudget"
)

// A client connection, whatever its mode, is served here: its requests are read
// as bounded heads over net/http's parser, HTTP/1.x requests go through the tail
// (pipeline.go) with h1Side as their client side, and responses and refusals are
// written back with a deadline on every write. A CONNECT, and TLS on a transparent
// listener, are served by tunnel.go.

var errTooManyFiles = syscall.EMFILE

// conn is one sandbox connection on an explicit proxy listener: a loop of requests,
// ended by a CONNECT tunnel, a refusal that leaves the framing in doubt, the client,
// an idle timeout or shutdown.
type conn struct {
	s    *Server
	l    *listener
	nc   net.Conn
	head headReader
	br   *bufio.Reader
	bw   *bufio.Writer
	idle atomic.Bool // waiting for the next request; Shutdown may close it
	// slot is what the connection holds: a main slot, none yet (being admitted
	// to the hook lane), or a lane slot; lane restricts it to pre-tool hook calls
	// (server.go). Inner connections of an intercepted tunnel share the outer's.
	slot   slotKind
	lane   bool
	laneAt time.Time // when an outer lane connection took its slot
	isCut  atomic.Bool
	// cutCtx ends when a lane connection is cut (server.go): a hook call on it then
	// gets the deny at once. Nil outside the lane.
	cutCtx context.Context
	cutFn  context.CancelFunc
	// laneRoot is the outer lane connection (itself, or the one an intercepted
	// inner connection runs in); inCall is set on it once a hook call has begun.
	laneRoot *conn
	inCall   atomic.Bool
	// closedFor is set on an outer connection egressd cuts or closes: the detail
	// its egress line gives (recordClose); lifeTimer cuts a lane connection at
	// the end of its life, cutTimer closes a cut one. Both are stopped when the
	// connection ends: a pending timer keeps the connection and its buffers.
	closedFor atomic.Pointer[string]
	lifeTimer *time.Timer
	cutTimer  atomic.Pointer[time.Timer]
	// release gives the connection's slot back (once; serveIn); onEnd, when set,
	// gives back its place beyond the listener's bound (awaitRoom) once the
	// connection has ended (ended).
	release func()
	onEnd   func()
	// tunneling is set once the connection carries bytes egressd does not frame
	// (a tunnel, an upgrade) or is the outside of an intercepted tunnel, whose
	// requests are counted on the inner connection, or in streams for HTTP/2.
	// Shutdown closes such connections without waiting for them.
	tunneling atomic.Bool
	streams   atomic.Int32
	// waitSince is when the connection began waiting for the client (a request head
	// or a ClientHello), in Unix nanoseconds; 0 while it is serving, evicted once
	// an overloaded listener has taken its slot (server.go).
	waitSince atomic.Int64
	// hookKeepAlive is set while the connection's last request was a pre-tool hook
	// call: waiting for its next request, it is never evicted (server.go).
	hookKeepAlive atomic.Bool

	// mem is what the connection holds of the memory budget (server.go).
	mem *connMem

	// route is the connection's mode (conn.go), fixed before its first request.
	route route
	// requests counts the requests the connection has carried.
	requests int
	// authIdent is what the tunnel's CONNECT presented as Proxy-Authorization
	// under hooks.identify runtime_auth (hookcall.go); inner connections and
	// HTTP/2 streams inherit it.
	authIdent string

	// began is when the connection, or the tunnel it runs in, was accepted;
	// served is set once an exchange has begun on it (exchangeStart).
	began  time.Time
	served atomic.Bool

	ctx    context.Context
	cancel context.CancelFunc
}

func newConn(s *Server, l *listener, nc net.Conn) *conn {
	c := &conn{s: s, l: l, nc: nc, mem: &connMem{}, began: time.Now()}
	c.head = headReader{r: nc}
	c.br = bufio.NewReaderSize(&c.head, headChunk)
	c.bw = bufio.NewWriterSize(&clientWriter{Conn: nc, d: s.Snapshot().Limits.ClientWrite}, 4096)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// exchangeStart is when the client may have begun the request an exchange serves:
// for the first on a connection, when the connection (or the tunnel it runs in)
// was accepted, so that its CONNECT and TLS handshake, which a flood can slow,
// count against a hook call's deadline as they count against the runtime's own
// timeout; for a later one, now, as its head has just been read.
func (c *conn) exchangeStart() time.Time {
	if c.served.Swap(true) {
		return time.Now()
	}
	return c.began
}

// ended runs once the connection has been closed for good.
func (c *conn) ended() {
	if c.lifeTimer != nil {
		c.lifeTimer.Stop()
	}
	if t := c.cutTimer.Load(); t != nil {
		t.Stop()
	}
	c.mem.release()
	if c.onEnd != nil {
		c.onEnd()
	}
}

// abort ends the connection and everything it is waiting on.
func (c *conn) abort() {
	c.cancel()
	c.nc.Close()
}

func (c *conn) serve() {
	defer c.abort()
	defer c.recoverPanic()
	c.serveLoop()
}

// serveLoop reads and serves requests until the connection is done.
func (c *conn) serveLoop() {
	for c.nextRequest() {
		snap := c.s.Snapshot()
		req, err := readRequest(c.br, &c.head, snap.Limits.MaxHeaderBytes, c.s.mem)
		if !c.waited() {
			c.closeEvicted(snap)
			return
		}
		if err != nil {
			c.refuseHead(snap, req, err)
			return
		}
		if !c.handle(snap, req) || c.s.closing.Load() {
			return
		}
	}
}

// nextRequest waits up to limits.client_idle for the first byte of the next request,
// then gives the client limits.read_header to send the whole head.
func (c *conn) nextRequest() bool {
	snap := c.s.Snapshot()
	c.idle.Store(true)
	defer c.idle.Store(false)
	if c.s.closing.Load() {
		return false
	}
	c.waitFor(snap.Limits.ClientIdle)
	if _, err := c.br.Peek(1); err != nil {
		if c.waitSince.Load() == evicted {
			c.closeEvicted(snap)
		}
		return false
	}
	c.nc.SetReadDeadline(time.Now().Add(snap.Limits.ReadHeader))
	// An eviction between the Peek and the line above had its deadline overwritten.
	return c.waitSince.Load() != evicted
}

func (c *conn) recoverPanic() {
	if v := recover(); v != nil {
		c.s.log.Error().Str("listener", c.l.cfg.Name).Str("panic", fmt.Sprint(v)).
			Bytes("stack", debug.Stack()).Msg("panic serving connection; connection closed")
	}
}

// handle serves one request and reports whether the connection may carry another.
func (c *conn) handle(snap *Snapshot, req *http.Request) bool {
	rec := newRecord(c.l, c.nc.RemoteAddr())
	rec.Method = req.Method
	defer rec.finish(&c.s.log, c.s.metrics)
	defer c.recordClose(rec)
	c.requests++
	done, ok := c.holdFor(snap, req)
	if !ok {
		return c.refuseAndClose(snap, rec, errConnMemory)
	}
	defer done()
	if c.route.mode == modeExplicit && req.Method == http.MethodConnect {
		return c.serveConnect(snap, req, rec)
	}
	return c.serveHTTP1(snap, req, rec)
}

// closeEvicted answers and records a connection whose slot a newcomer took
// while it waited for its client (server.go): 503 overloaded when the client has
// begun a request or has yet to send its first, then a half-close and a bounded
// drain. An idle keep-alive connection is only recorded: an answer it did not ask
// for would be read as the answer to its next request.
func (c *conn) closeEvicted(snap *Snapshot) {
	if c.release != nil { // the newcomer waits for the slot (slotWait), not for this answer
		c.release()
		c.l.overflow.Add(1)
		defer c.l.overflow.Add(-1)
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	defer rec.finish(&c.s.log, c.s.metrics)
	why := deny(allowlist.ReasonOverloaded, detailEvicted)
	if c.requests > 0 && c.br.Buffered() == 0 {
		rec.refused(why)
		return
	}
	c.nc.SetDeadline(time.Now().Add(time.Second))
	c.writeRefusalHead(snap, rec, why, 0, true)
	c.lingerClose()
}

// refuseHead answers a request head that could not be read or was malformed.
func (c *conn) refuseHead(snap *Snapshot, req *http.Request, err error) {
	if isTimeout(err) || isClosed(err) {
		return // the client went away or never finished: nobody to answer
	}
	rec := newRecord(c.l, c.nc.RemoteAddr())
	if req != nil {
		rec.Method = req.Method
	}
	defer rec.finish(&c.s.log, c.s.metrics)
	switch {
	case err == errHeadTooLarge:
		c.writeRefusal(snap, rec, &refusal{Reason: allowlist.ReasonBadRequest, Detail: "header_too_large", Err: err},
			http.StatusRequestHeaderFieldsTooLarge)
	case err == errHeadBudget:
		// The head is still arriving: close after the answer, and read what
		// follows it for a moment so that the close does not destroy the answer.
		c.refuseAndClose(snap, rec, err)
	default:
		c.writeRefusal(snap, rec, badRequestFrom(err), 0)
	}
}

// writeRefusal records err on rec and writes its response. A status of 0 means the
// status docs/reasons.md assigns to the reason.
func (c *conn) writeRefusal(snap *Snapshot, rec *Record, err error, status int) {
	c.writeRefusalHead(snap, rec, err, status, false)
}

// writeRefusalHead is writeRefusal, announcing Connection: close when closeConn is
// set or the connection was accepted only to say why it is refused. The status
// line's reason phrase names the reason (refusalPhrase).
func (c *conn) writeRefusalHead(snap *Snapshot, rec *Record, err error, status int, closeConn bool) {
	code, h, body := refusalFor(snap, rec, err, status)
	writeHeadPhrase(c.bw, code, refusalPhrase(code, rec.Reason), h, closeConn || c.route.mode == modeRefused)
	n, _ := c.bw.Write(body)
	rec.BytesOut += int64(n)
	c.bw.Flush()
}

// refuseAndClose answers a refused CONNECT or Upgrade with Connection: close and
// ends the connection: whatever the client sent after the request (an optimistic
// ClientHello, an h2c preface, a pipelined request) is read only to be discarded,
// never parsed. It reports false, for the connection loop.
func (c *conn) refuseAndClose(snap *Snapshot, rec *Record, err error) bool {
	c.writeRefusalHead(snap, rec, err, 0, true)
	c.lingerClose()
	return false
}

// Bounds of lingerClose: how long and how much it reads after the refusal.
const (
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 64 << 10
)

// lingerClose half-closes the connection and discards what the client still sends,
// for a bounded time and size, before the caller closes it: closing a socket with
// unread bytes sends a reset, which can destroy the refusal before the client has
// read it (net/http's server does the same after an error).
func (c *conn) lingerClose() {
	cw, ok := c.nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.nc.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c.nc, lingerBytes)
}

// rejectOverloaded answers a connection beyond the listener's bound with 503
// overloaded (detail names why, when it is not merely that) and closes it, after
// a half-close and a bounded drain so that the answer is read, not reset.
func (c *conn) rejectOverloaded(detail string) {
	defer c.abort()
	c.nc.SetDeadline(time.Now().Add(time.Second))
	rec := newRecord(c.l, c.nc.RemoteAddr())
	defer rec.finish(&c.s.log, c.s.metrics)
	c.writeRefusalHead(c.s.Snapshot(), rec, deny(allowlist.ReasonOverloaded, detail), 0, true)
	c.lingerClose()
}

// connMode is how a connection's requests are read and decided. It is fixed when
// the connection is accepted (explicit, transparent) or when the tunnel it runs in
// is intercepted (tunnel, refused), and never changes after.
type connMode uint8

const (
	// modeExplicit: absolute-form requests and CONNECT, each decided on its own target.
	modeExplicit connMode = iota
	// modeTransparent: plain HTTP redirected to a transparent listener, decided on
	// the Host header's name at the original destination's port.
	modeTransparent
	// modeTunnel: inside an intercepted tunnel; every request is decided against the
	// tunnel's target, never against its own Host.
	modeTunnel
	// modeRefused: inside a tunnel accepted only to say why it is refused; a hook
	// call gets its fail-closed deny, every other request the refusal.
	modeRefused
)

// route is a connection's mode with what that mode reads requests against.
type route struct {
	mode    connMode
	target  allowlist.Target // modeTunnel, modeRefused: the CONNECT target or SNI
	orig    netip.AddrPort   // modeTransparent: the original destination
	refusal error            // modeRefused: the answer to every request
	// plain: modeTunnel, modeRefused: a CONNECT tunnel that carries plain HTTP, not
	// TLS; its requests are decided as http:// requests.
	plain bool
}

// inTunnel reports whether the requests arrive inside an intercepted tunnel.
func (r route) inTunnel() bool { return r.mode == modeTunnel || r.mode == modeRefused }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

// errHeadTooLarge is returned when a request head exceeds limits.max_header_bytes,
// or has more than maxHeadLines lines.
var errHeadTooLarge = errors.New("request head too large")

// maxHeadLines bounds a request head's lines (its request line and fields), as
// Envoy's max_headers_count does (100 by default): net/http's parsed form of a
// field costs far more than its bytes, so a head of thousands of one-byte fields,
// within limits.max_header_bytes, would cost megabytes outside the memory budget
// once parsed and held with its request.
const maxHeadLines = 101

// A request head is held once while it is read, and checked as sent before net/http
// parses it: the framing checks below must see the bytes net/http would normalise
// (it drops Content-Length when Transfer-Encoding is present, and unfolds obs-fold).
//
// A head that fits in the connection's read buffer (headChunk, as almost every head
// does) is found there, checked, and parsed from it: it costs nothing beyond the
// buffer the connection has anyway. A larger one is moved into memory mapped for it
// from the kernel (largeHead), each page reserved from the memory budget before it
// is first written, so that many large heads sent slowly (each within
// limits.max_header_bytes and limits.read_header) cost at most the budget; the
// connection whose page does not fit is refused (overloaded, detail memory_heads).
// Once its end has come, the head is checked and handed back to net/http through
// headReader's replay, in front of whatever the client sent after it, and the
// mapping is returned to the kernel.
//
// The mapping keeps large heads off the Go heap: their memory leaves the process
// the moment they are parsed or refused, and they never raise the collector's heap
// goal (a heap holding a budget's worth of heads may otherwise grow to twice that
// before it collects, and the garbage of refused ones with it).

// headChunk is the connection's read buffer, and the unit (a page) a large head's
// memory is reserved in.
const headChunk = 4 << 10

// headReader is what the connection's bufio.Reader reads: the client, after a
// large head given back for net/http to parse (replay).
type headReader struct {
	r      io.Reader
	replay []byte
}

func (h *headReader) Read(p []byte) (int, error) {
	if len(h.replay) > 0 {
		n := copy(p, h.replay)
		h.replay = h.replay[n:]
		return n, nil
	}
	return h.r.Read(p)
}

// readRequest reads one request head from br (which reads from h), bounded by max
// bytes and by mem, and rejects smuggling-shaped framing that net/http would
// silently repair.
func readRequest(br *bufio.Reader, h *headReader, max int, mem *membudget.Budget) (*http.Request, error) {
	var scan headScan
	end, err := scan.inBuffer(br, max)
	if err != nil {
		return nil, err
	}
	if end < 0 {
		return readLargeRequest(br, h, &scan, max, mem)
	}
	head, _ := br.Peek(end)
	te, framingErr := checkFraming(head)
	return parseHead(br, te, framingErr)
}

// readLargeRequest reads a head that outgrew the read buffer into a largeHead,
// then has net/http parse it from there.
func readLargeRequest(br *bufio.Reader, h *headReader, scan *headScan, max int, mem *membudget.Budget) (*http.Request, error) {
	lh := largeHead{mem: mem}
	defer lh.release()
	if err := lh.read(br, scan, max); err != nil {
		return nil, err
	}
	te, framingErr := checkFraming(lh.buf)
	rest, _ := br.Peek(br.Buffered())
	if err := lh.append(rest); err != nil {
		return nil, err
	}
	h.replay = lh.buf
	br.Reset(h)
	defer func() { h.replay = nil }() // nothing may read the mapping once released
	req, err := parseHead(br, te, framingErr)
	if req != nil && len(h.replay) > 0 {
		// What is left is what the client sent after the head, at most a buffer's
		// worth: move it into the buffer, where whoever reads the connection next
		// (a tunnel reads it directly) finds it.
		br.Peek(br.Buffered() + len(h.replay))
	}
	return req, err
}

// headScan finds the end of a request head as net/http's parser does: the first
// empty line after the request line, where a line ends in LF and one CR before
// it is dropped.
type headScan struct {
	seen  int  // bytes scanned
	lines int  // lines ended
	n     int  // bytes of the current line
	first byte // its first byte
}

// feed scans b, which follows what was scanned before, and returns the length of
// b up to and including the head's end, or -1.
func (s *headScan) feed(b []byte) int {
	for i, c := range b {
		if c != '\n' {
			if s.n == 0 {
				s.first = c
			}
			s.n++
			continue
		}
		empty := s.n == 0 || s.n == 1 && s.first == '\r'
		s.lines++
		s.n = 0
		if empty && s.lines > 1 {
			s.seen += i + 1
			return i + 1
		}
	}
	s.seen += len(b)
	return -1
}

// over reports whether what has been scanned is past max bytes or maxHeadLines
// lines (the empty line that ends the head not counted).
func (s *headScan) over(max int) bool { return s.seen > max || s.lines > maxHeadLines+1 }

// inBuffer waits until br holds the whole head, and returns its length, or -1
// once the buffer is full without it.
func (s *headScan) inBuffer(br *bufio.Reader, max int) (int, error) {
	for {
		b, _ := br.Peek(br.Buffered())
		if end := s.feed(b[s.seen:]); end >= 0 {
			if s.over(max) {
				return 0, errHeadTooLarge
			}
			return s.seen, nil
		}
		if s.over(max) {
			return 0, errHeadTooLarge
		}
		if s.seen == br.Size() {
			return -1, nil
		}
		if _, err := br.Peek(s.seen + 1); err != nil {
			if err == io.EOF && s.seen > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
}

// largeHead is a head being read into memory mapped for it, reserved from mem a
// page at a time as the head grows.
type largeHead struct {
	mem      *membudget.Budget
	buf      []byte // the mapping, its length what is held
	reserved int64
}

var errHeadBudget = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Heads.Detail(),
	Err: errors.New("limits.memory reached: too many large request heads being read at once")}

// read moves the head from br into the mapping until its end has been scanned,
// or it exceeds max bytes, or a page does not fit in the budget. br holds what
// scan has scanned so far (a full buffer, without the head's end).
func (lh *largeHead) read(br *bufio.Reader, scan *headScan, max int) error {
	// The first page is reserved before anything is mapped: a connection the
	// budget refuses costs no system call.
	if !lh.mem.Reserve(membudget.Heads, headChunk) {
		return errHeadBudget
	}
	lh.reserved = headChunk
	// The mapping holds the largest head and what may follow it in br.
	m, err := unix.Mmap(-1, 0, max+headChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return errHeadBudget // the kernel's memory, not only the budget's, is short
	}
	lh.buf = m[:0]
	b, _ := br.Peek(scan.seen) // no end in it: moved as it is
	end := -1
	for {
		if len(lh.buf)+len(b) > max {
			return errHeadTooLarge
		}
		if err := lh.append(b); err != nil {
			return err
		}
		br.Discard(len(b))
		if end >= 0 {
			return nil
		}
		if b, err = peekMore(br); err != nil {
			return err
		}
		if end = scan.feed(b); end >= 0 {
			b = b[:end]
		}
		if scan.over(max) {
			return errHeadTooLarge
		}
	}
}

// peekMore waits for bytes in br and returns all it holds.
func peekMore(br *bufio.Reader) ([]byte, error) {
	if _, err := br.Peek(1); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	b, _ := br.Peek(br.Buffered())
	return b, nil
}

// append copies b after what the mapping holds, reserving the pages it reaches
// first.
func (lh *largeHead) append(b []byte) error {
	if n := len(lh.buf) + len(b); n > cap(lh.buf) {
		return errHeadTooLarge // read keeps heads within the mapping
	} else if touched := int64(n+headChunk-1) / headChunk * headChunk; touched > lh.reserved {
		if !lh.mem.Reserve(membudget.Heads, touched-lh.reserved) {
			return errHeadBudget
		}
		lh.reserved = touched
	}
	lh.buf = append(lh.buf, b...)
	return nil
}

// release returns the mapping to the kernel and its pages to the budget.
func (lh *largeHead) release() {
	if lh.buf != nil {
		unix.Munmap(lh.buf[:cap(lh.buf)])
		lh.buf = nil
	}
	lh.mem.Release(membudget.Heads, lh.reserved)
	lh.reserved = 0
}

// checkFraming rejects heads that carry both Content-Length and Transfer-Encoding
// (RFC 9112 §6.1: "ought to be handled as an error") and obs-fold continuation
// lines (RFC 9112 §5.2), the usual material of request smuggling, and reports
// whether the head names Transfer-Encoding (finishHead refuses it in HTTP/1.0).
// head runs to the end of its empty line.
func checkFraming(head []byte) (te bool, err error) {
	_, rest, _ := bytes.Cut(head, []byte("\n")) // skip the request line
	var cl bool
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if len(line) == 0 || len(line) == 1 && line[0] == '\r' {
			break // the empty line that ends the head
		}
		if line[0] == ' ' || line[0] == '\t' {
			return te, badRequest("obs_fold", errors.New("obsolete line folding in request head"))
		}
		name, _, _ := bytes.Cut(line, []byte(":"))
		if !validFieldName(name) {
			return te, badRequest("invalid_header_name", errors.New("header field name is not an RFC 9110 token"))
		}
		cl = cl || bytes.EqualFold(name, []byte("Content-Length"))
		te = te || bytes.EqualFold(name, []byte("Transfer-Encoding"))
	}
	if cl && te {
		return te, badRequest("content_length_and_transfer_encoding",
			errors.New("both Content-Length and Transfer-Encoding in request head"))
	}
	return te, nil
}

// parseHead has net/http parse the head br holds, which checkFraming found
// framed as te and framingErr say. net/http's own error comes first, as when it
// was the first to look; an HTTP/1.0 request with Transfer-Encoding is refused
// (RFC 9112 §6.1: its framing is faulty; net/http ignores the field and an
// upstream may not).
func parseHead(br *bufio.Reader, te bool, framingErr error) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	if framingErr == nil && te && !req.ProtoAtLeast(1, 1) {
		framingErr = badRequest("http10_transfer_encoding", errors.New("transfer-encoding in an HTTP/1.0 request"))
	}
	return req, framingErr
}

// validFieldName reports whether name is an RFC 9110 token; a header line ends in
// CR, which is not part of the name since the name stops at the colon.
func validFieldName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

// badRequestFrom turns a request-parsing error into a bad_request refusal.
func badRequestFrom(err error) error {
	var rf *refusal
	if errors.As(err, &rf) {
		return rf
	}
	return badRequest("malformed_request", err)
}

// serveHTTP1 serves one HTTP/1.x request, in any mode, and reports whether the
// connection may carry another request.
func (c *conn) serveHTTP1(snap *Snapshot, req *http.Request, rec *Record) bool {
	x := newExchange(c, snap, req, rec, c.route)
	x.body.deadline = &bodyDeadline{set: c.nc.SetReadDeadline, perRead: snap.Limits.ReadHeader}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	x.unwatch = c.watchGone(req, cancel)
	keep := serveRequest(ctx, x, h1Side{c: c, wantClose: req.Close || !req.ProtoAtLeast(1, 1)})
	c.hookKeepAlive.Store(x.preHook)
	return keep
}

// h1Side is the tail's client side on an HTTP/1.x connection.
type h1Side struct {
	c         *conn
	wantClose bool // the client asked to close, or speaks HTTP/1.0
}

// sendContinue answers the client's Expect: 100-continue.
func (s h1Side) sendContinue() { s.c.writeContinue() }

// refuse writes the refusal. Only a request refused before anything was forwarded
// leaves the framing intact, once its body is drained; a refused CONNECT or Upgrade
// (or anything on a lane connection) closes at once: what the client sent after it
// belongs to another protocol and is never parsed.
func (s h1Side) refuse(x *exchange, err error) bool {
	if x.stage == stageLane || x.stage >= stagePrepare && switchesProtocol(x.req) {
		return s.c.refuseAndClose(x.snap, x.rec, err)
	}
	s.c.writeRefusal(x.snap, x.rec, err, 0)
	return x.stage == stagePrepare && !s.wantClose && x.body.drain()
}

// respond writes resp. A 101 switches the connection (serveUpgrade); a hook call's
// answer closes a lane or refused connection (it serves one call).
func (s h1Side) respond(x *exchange, resp *http.Response) bool {
	wantClose := s.wantClose
	switch {
	case x.stage == stageHook:
		wantClose = wantClose || x.lane != nil || x.route.mode == modeRefused
	case resp.StatusCode == http.StatusSwitchingProtocols:
		s.c.serveUpgrade(x, resp)
		return false
	}
	upgrade := x.stage != stageHook && switchesProtocol(x.req) // and the upstream declined it
	keep, err := writeResponse(s.c.bw, x.req.Method, wantClose || upgrade, resp, x.rec)
	if err == nil && (upgrade || x.stage == stageHook && !keep) {
		// What the client sent ahead belongs to the other protocol; a hook call's
		// body may still be on its way (a cut call is answered before it is
		// read): closing over unread bytes would reset the answer away.
		s.c.lingerClose()
	}
	return err == nil && keep && x.body.drain()
}

// writeContinue answers the client's Expect: 100-continue.
func (c *conn) writeContinue() {
	c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	c.bw.Flush()
}

// watchGone cancels the request (cancel) when its HTTP/1 client closes the
// connection while egressd decides, dials or waits for the upstream, so that nothing
// is dialled or forwarded for a client that has gone (client_cancelled), as an HTTP/2
// RST_STREAM does. Like net/http's server it reads the connection meanwhile; a byte
// it reads (a pipelined request) stays buffered for the next request. Only a request
// whose body is complete can be watched: a request with a body, an upgrade or a
// CONNECT is not. The returned stop ends the watch; call it before the connection is
// read or lingered on again.
func (c *conn) watchGone(req *http.Request, cancel context.CancelFunc) (stop func()) {
	if req.ContentLength != 0 || len(req.TransferEncoding) > 0 || switchesProtocol(req) {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.br.Peek(1); err != nil && !isTimeout(err) {
			cancel()
		}
	}()
	return func() {
		c.nc.SetReadDeadline(time.Unix(1, 0)) // ends the Peek
		<-done
		c.nc.SetReadDeadline(time.Time{})
	}
}

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
