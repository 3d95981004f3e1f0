package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestExpectContinue: a client that sends Expect: 100-continue and waits for the
// 100 before its body (curl after 1 s, botocore, .NET and git pushes wait longer)
// gets egressd's 100 once the request is allowed, on the explicit proxy and inside
// an intercepted tunnel. The upstream gets the body and no Expect of its own: the
// outbound request's header map is its own, so removing Expect there leaves the
// client's request as it was sent.
func TestExpectContinue(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	const head = "Content-Type: text/plain\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
	cases := []struct {
		name string
		dial func(t *testing.T) (net.Conn, *bufio.Reader)
		req  string
	}{
		{"explicit", w.dialProxy, "POST http://www.allowed.test/up HTTP/1.1\r\nHost: www.allowed.test\r\n" + head},
		{"intercepted", func(t *testing.T) (net.Conn, *bufio.Reader) {
			tc, br := w.interceptedH1(t, "api.allowed.test")
			return tc, br
		}, "POST /up HTTP/1.1\r\nHost: api.allowed.test\r\n" + head},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, br := tc.dial(t)
			io.WriteString(c, tc.req)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			cont, err := http.ReadResponse(br, nil)
			if err != nil || cont.StatusCode != http.StatusContinue {
				t.Fatalf("waiting for 100 Continue: %v %v", cont, err)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "hello")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := decodeEcho(t, resp)
			if got.Body != "hello" || got.Header.Get("Expect") != "" {
				t.Errorf("upstream got body %q, Expect %q", got.Body, got.Header.Get("Expect"))
			}
		})
	}
}
