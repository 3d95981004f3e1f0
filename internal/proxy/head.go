package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/membudget"
)

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
