package proxy

import (
	"io"
	"strings"
	"testing"
)

// TestSniffReaderOneRead: the sniffed bytes come back with the rest of the
// first read, not on their own (an extra read would be an extra write and TLS
// record to the client); a body shorter than the sniff comes back whole.
func TestSniffReaderOneRead(t *testing.T) {
	for _, body := range []string{"0123456789", "ab", ""} {
		var s sniffReader
		if head := s.peek(strings.NewReader(body)); string(head) != body[:min(len(body), 4)] {
			t.Errorf("%q: sniffed %q", body, head)
		}
		p := make([]byte, 64)
		n, err := s.Read(p)
		if string(p[:n]) != body || err != nil && err != io.EOF {
			t.Errorf("%q: first read %q, %v", body, p[:n], err)
		}
		if rest, err := io.ReadAll(&s); len(rest) != 0 || err != nil {
			t.Errorf("%q: then %q, %v", body, rest, err)
		}
	}
}
