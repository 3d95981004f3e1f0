package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/membudget"
)

// TestHeadsAroundTheBuffer: heads that end just before, at and just after the
// connection's read buffer (headChunk), or far beyond it, are read whole, their
// bodies and the request pipelined after them intact, and a large head's pages go
// back to the budget once it is parsed.
func TestHeadsAroundTheBuffer(t *testing.T) {
	mem := membudget.New(1 << 20)
	for _, size := range []int{100, headChunk - 2, headChunk - 1, headChunk, headChunk + 1, headChunk + 2, 3 * headChunk, 60 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			first := padHead("POST /first HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n", size)
			in := first + "hello" + "GET /second HTTP/1.1\r\nHost: a\r\n\r\n"
			h := &headReader{r: bytes.NewReader([]byte(in))}
			br := bufio.NewReaderSize(h, headChunk)
			req, err := readRequest(br, h, 64<<10, mem)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(req.Body)
			if req.URL.Path != "/first" || string(body) != "hello" || len(req.Header.Get("X-Pad")) == 0 {
				t.Fatalf("first: %s, body %q", req.URL.Path, body)
			}
			if mem.Held(membudget.Heads) != 0 {
				t.Errorf("a parsed head still holds %d bytes of the budget", mem.Held(membudget.Heads))
			}
			req, err = readRequest(br, h, 64<<10, mem)
			if err != nil || req.URL.Path != "/second" {
				t.Fatalf("second: %v %v", req, err)
			}
		})
	}
}

// padHead ends head with an X-Pad field that makes it size bytes with its end.
func padHead(head string, size int) string {
	const field, end = "X-Pad: \r\n", "\r\n"
	pad := max(size-len(head)-len(field)-len(end), 1)
	return head + "X-Pad: " + strings.Repeat("p", pad) + "\r\n" + end
}

// TestLargeHeadRefusedPastTheBudget: a large head whose next page does not fit is
// refused overloaded (memory_heads), and what it had reserved is given back.
func TestLargeHeadRefusedPastTheBudget(t *testing.T) {
	mem := membudget.New(3 * headChunk)
	in := padHead("GET / HTTP/1.1\r\nHost: a\r\n", 10*headChunk)
	h := &headReader{r: bytes.NewReader([]byte(in))}
	_, err := readRequest(bufio.NewReaderSize(h, headChunk), h, 64<<10, mem)
	if err != errHeadBudget {
		t.Fatalf("err = %v, want the budget's refusal", err)
	}
	if mem.Used() != 0 {
		t.Errorf("the refused head still holds %d bytes", mem.Used())
	}
}
