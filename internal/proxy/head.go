package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// errHeadTooLarge is returned when a request head exceeds limits.max_header_bytes.
var errHeadTooLarge = errors.New("request head too large")

// headReader sits between the connection and its bufio.Reader. While a request head
// is being read it bounds the bytes read and keeps a copy of them, so the framing
// checks below can see the head as sent, before net/http normalises it (net/http
// drops Content-Length when Transfer-Encoding is present, and unfolds obs-fold).
type headReader struct {
	r       io.Reader
	limit   int // bytes left for the head; < 0 when no head is being read
	hitMax  bool
	capture []byte
}

func (h *headReader) Read(p []byte) (int, error) {
	if h.limit == 0 {
		h.hitMax = true
		return 0, errHeadTooLarge
	}
	if h.limit > 0 && len(p) > h.limit {
		p = p[:h.limit]
	}
	n, err := h.r.Read(p)
	if h.limit > 0 {
		h.limit -= n
		h.capture = append(h.capture, p[:n]...)
	}
	return n, err
}

// readRequest reads one request head from br (which reads from h), bounded by max
// bytes, and rejects smuggling-shaped framing that net/http would silently repair.
func readRequest(br *bufio.Reader, h *headReader, max int) (*http.Request, error) {
	buffered, _ := br.Peek(br.Buffered())
	h.capture = append(h.capture[:0], buffered...)
	h.limit, h.hitMax = max-len(buffered), false
	if h.limit <= 0 {
		h.limit = 1 // the buffered bytes hold the whole allowance; let the parser decide
	}
	req, err := http.ReadRequest(br)
	h.limit = -1
	if h.hitMax {
		return nil, errHeadTooLarge
	}
	if err != nil {
		return nil, err
	}
	head := h.capture
	if end := bytes.Index(head, []byte("\r\n\r\n")); end >= 0 {
		head = head[:end]
	}
	if len(head) > max {
		return nil, errHeadTooLarge
	}
	err = checkFraming(head, !req.ProtoAtLeast(1, 1))
	if cap(h.capture) > 16<<10 {
		h.capture = nil // do not keep a large head's buffer for the connection's life
	}
	return req, err
}

// checkFraming rejects heads that carry both Content-Length and Transfer-Encoding
// (RFC 9112 §6.1: "ought to be handled as an error"), an HTTP/1.0 request with
// Transfer-Encoding (§6.1: its framing is faulty; net/http ignores the field and an
// upstream may not), and obs-fold continuation lines (RFC 9112 §5.2), the usual
// material of request smuggling.
func checkFraming(head []byte, http10 bool) error {
	_, rest, _ := bytes.Cut(head, []byte("\n")) // skip the request line
	var cl, te bool
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			return badRequest("obs_fold", errors.New("obsolete line folding in request head"))
		}
		name, _, _ := bytes.Cut(line, []byte(":"))
		if !validFieldName(name) {
			return badRequest("invalid_header_name", errors.New("header field name is not an RFC 9110 token"))
		}
		cl = cl || bytes.EqualFold(name, []byte("Content-Length"))
		te = te || bytes.EqualFold(name, []byte("Transfer-Encoding"))
	}
	if cl && te {
		return badRequest("content_length_and_transfer_encoding",
			errors.New("both Content-Length and Transfer-Encoding in request head"))
	}
	if te && http10 {
		return badRequest("http10_transfer_encoding", errors.New("transfer-encoding in an HTTP/1.0 request"))
	}
	return nil
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
