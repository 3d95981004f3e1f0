package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUnaskedSwitchRefused: an upstream that answers 101 to a request that named
// no protocol in an Upgrade gets no tunnel (RFC 9110 §15.2.2): the client gets
// 502 upstream_unreachable, on the pool's path (a GET) as on the Transport's (a
// POST, which egressd used to switch into a raw tunnel to the upstream).
func TestUnaskedSwitchRefused(t *testing.T) {
	w := poolWorld(t)
	up := startRawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: raw\r\nConnection: Upgrade\r\n\r\nraw bytes") // then close
	})
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		c := w.client()             // a refusal after forwarding closes the client's connection
		c.Timeout = 5 * time.Second // a switched connection would never end
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader("payload")
		}
		req, _ := http.NewRequest(method, up.url, body)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		got, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Egressd-Reason") != "upstream_unreachable" {
			t.Errorf("%s answered 101 unasked: %d %q %q, want 502 upstream_unreachable", method, resp.StatusCode, resp.Header.Get("Egressd-Reason"), got)
		}
	}
}
