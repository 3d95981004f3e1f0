package proxy

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
)

// FuzzReadRequest: random bytes on a connection go through the same loop the
// listener runs (readRequest, then the body, then the next request, up to three),
// and never panic. Whenever a head is accepted, the head as sent (not as net/http
// repaired it) has no obs-fold line and does not carry both Content-Length and
// Transfer-Encoding (nor an HTTP/1.0 one Transfer-Encoding), and no head longer
// than the limit is accepted.
func FuzzReadRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\nabcdGET http://b.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\nX-T: 1\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\ncontent-length: 4\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
		"GET /x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n\tTransfer-Encoding: chunked\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
		"POST /x HTTP/1.1\nHost: a\nContent-Length: 1\nTransfer-Encoding: chunked\n\n0\n\n",
		"POST /x HTTP/1.1\nHost: a\nContent-Length: 1\n\nx",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\n0\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: a\r\n\n",
		"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n\x16\x03\x01",
		"GET / HTTP/1.0\r\n\r\n",
		"POST /x HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /x HTTP/1.0\r\nHost: a\r\ntransfer-encoding: identity\r\nConnection: keep-alive\r\n\r\n",
		// Heads beyond the read buffer (headChunk), read into reserved chunks.
		"POST /x HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 6000) + "\r\nContent-Length: 4\r\n\r\nabcdGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x HTTP/1.1\r\n" + strings.Repeat("X-Many: 0123456789abcdef\r\n", 180) + "\r\n" + strings.Repeat("GET /p HTTP/1.1\r\nHost: a\r\n\r\n", 3),
		"GET /x HTTP/1.1\r\nHost: a\r\nX-A: " + strings.Repeat("a", 5000) + "\r\n folded\r\n\r\n",
		"POST /x HTTP/1.1\r\n" + strings.Repeat("X-P: 1\r\n", 700) + "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(4096))
		f.Add([]byte(s), uint16(40))
		f.Add([]byte(s), uint16(8000))
	}
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		max := 16 + int(limit)%(8<<10)
		h := &headReader{r: bytes.NewReader(data)}
		br := bufio.NewReaderSize(h, 4096)
		for range 3 {
			start := len(data) - remaining(h, br)
			req, err := readRequest(br, h, max, nil)
			if err != nil {
				return
			}
			raw := data[start:]
			head, complete := rawHead(raw)
			if !complete {
				t.Fatalf("accepted a head that has no end: %q", raw)
			}
			if len(head) > max+4 {
				t.Fatalf("accepted a %d-byte head with a limit of %d", len(head), max)
			}
			checkRawHead(t, head)
			if req.Body != nil {
				io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
			}
		}
	})
}

// remaining returns how many input bytes neither h nor br has handed out yet.
func remaining(h *headReader, br *bufio.Reader) int {
	return h.r.(*bytes.Reader).Len() + len(h.replay) + br.Buffered()
}

// rawHead returns the request head at the start of raw, as net/http's parser
// delimits it: up to and including the first empty line, where a line ends in LF
// and an optional CR before it is dropped. complete is false when no empty line
// ends it.
func rawHead(raw []byte) (head []byte, complete bool) {
	for i, first := 0, true; i < len(raw); first = false {
		j := bytes.IndexByte(raw[i:], '\n')
		if j < 0 {
			return raw, false
		}
		line := bytes.TrimSuffix(raw[i:i+j], []byte("\r"))
		i += j + 1
		if !first && len(line) == 0 {
			return raw[:i], true
		}
	}
	return raw, false
}

// checkRawHead is the reference for what an accepted head may not hold, read from
// the bytes as sent: no line of it (after the request line) starts with
// whitespace, and it does not name both Content-Length and Transfer-Encoding, in
// any case, with or without whitespace around the name.
func checkRawHead(t *testing.T, head []byte) {
	t.Helper()
	lines := bytes.Split(head, []byte("\n"))
	var cl, te bool
	for _, line := range lines[1:] {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			t.Fatalf("accepted a head with obs-fold: %q", head)
		}
		name, _, _ := bytes.Cut(line, []byte(":"))
		name = bytes.TrimSpace(name)
		cl = cl || bytes.EqualFold(name, []byte("Content-Length"))
		te = te || bytes.EqualFold(name, []byte("Transfer-Encoding"))
	}
	if cl && te {
		t.Fatalf("accepted a head with both Content-Length and Transfer-Encoding: %q", head)
	}
	if te && bytes.HasSuffix(bytes.TrimSuffix(lines[0], []byte("\r")), []byte(" HTTP/1.0")) {
		t.Fatalf("accepted an HTTP/1.0 head with Transfer-Encoding: %q", head)
	}
}

// TestReadRequestAcceptsPlainHeads keeps the fuzzer honest: the reference must
// not call ordinary heads bad.
func TestReadRequestAcceptsPlainHeads(t *testing.T) {
	for _, s := range []string{
		"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nabcd",
		"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	} {
		h := &headReader{r: bytes.NewReader([]byte(s))}
		req, err := readRequest(bufio.NewReader(h), h, 4096, nil)
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		if req.Method == "" {
			t.Errorf("%q: no method", s)
		}
		head, complete := rawHead([]byte(s))
		if !complete {
			t.Errorf("%q: rawHead found no end", s)
		}
		checkRawHead(t, head)
	}
}
