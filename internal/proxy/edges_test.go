package proxy_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Protocol edges of issue 13: each case asserts the refusal, what the upstream saw,
// and that the canaries saw nothing.

// pipelined is a request sent right behind a refused one: it must never be parsed.
const pipelined = "GET http://allowed.test/pipelined HTTP/1.1\r\nHost: allowed.test\r\n\r\n"

// dialProxy opens a raw connection to the proxy listener.
func (w *world) dialProxy(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", w.ProxyAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// sendRefusedThenClosed writes payload (a request and whatever the client sends
// ahead after it) in one write, asserts the refusal, and that the connection then
// ends: no second response, whatever followed the refused request.
func sendRefusedThenClosed(t *testing.T, c net.Conn, br *bufio.Reader, payload string, status int, reason, detail string) {
	t.Helper()
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	if !resp.Close {
		t.Error("refusal without Connection: close")
	}
	assertRefused(t, resp, status, reason, detail)
	assertClosed(t, br)
}

// assertClosed fails unless the connection ends with nothing more to read.
func assertClosed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	rest, err := io.ReadAll(br)
	if len(rest) > 0 {
		t.Errorf("bytes after the refusal: %q", rest)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Error("connection still open after the refusal")
	}
}

func (w *world) assertUpstreamSawNothing(t *testing.T) {
	t.Helper()
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d request(s)", n)
	}
	w.assertNoCanaryHit()
}

var h2cUpgrades = map[string]string{
	"with HTTP2-Settings":    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
	"without HTTP2-Settings": "Connection: Upgrade\r\nUpgrade: h2c\r\n",
	"without Connection":     "Upgrade: h2c\r\n",
	"in a list":              "Connection: upgrade\r\nUpgrade: websocket, H2C\r\n",
	"on a second line":       "Connection: upgrade\r\nUpgrade: websocket\r\nUpgrade: h2c/1\r\n",
}

// h2cPreface is what an optimistic h2c client sends after its upgrade request.
const h2cPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func TestH2CUpgradeRefusedExplicit(t *testing.T) {
	w := newWorld(t, worldOpts{})
	for name, hdr := range h2cUpgrades {
		t.Run(name, func(t *testing.T) {
			c, br := w.dialProxy(t)
			sendRefusedThenClosed(t, c, br, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n"+hdr+"\r\n"+h2cPreface+pipelined,
				400, "bad_request", "h2c_upgrade")
		})
	}
	w.assertUpstreamSawNothing(t)
	if l := w.lastLog(""); l["reason"] != "bad_request" || l["detail"] != "h2c_upgrade" || l["host"] != "allowed.test" {
		t.Errorf("log line: %v", l)
	}
}

func TestH2CUpgradeRefusedInsideTunnel(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	for name, hdr := range h2cUpgrades {
		t.Run(name, func(t *testing.T) {
			tc, br := w.interceptedH1(t, "api.allowed.test")
			sendRefusedThenClosed(t, tc, br, "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\n"+hdr+"\r\n"+h2cPreface+
				"GET /pipelined HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", 400, "bad_request", "h2c_upgrade")
		})
	}
	w.assertUpstreamSawNothing(t)
	w.assertSecretNotLogged()
}

// A refused WebSocket upgrade also ends the connection; an allowed one still works
// (TestWebSocketUpgradeGetsInjectedHeader).
func TestRefusedUpgradeCloses(t *testing.T) {
	w := newWorld(t, worldOpts{})
	c, br := w.dialProxy(t)
	sendRefusedThenClosed(t, c, br, "GET http://evil.test/ws HTTP/1.1\r\nHost: evil.test\r\nConnection: Upgrade\r\n"+
		"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"+pipelined,
		403, "not_allowlisted", "")
	w.assertUpstreamSawNothing(t)
}

func TestRefusedConnectCloses(t *testing.T) {
	w := newWorld(t, worldOpts{})
	hello := clientHelloBytes(t, "evil.test")
	cases := []struct{ name, head, ahead string }{
		{"not allowlisted, pipelined request", "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", pipelined},
		{"not allowlisted, optimistic ClientHello", "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", hello},
		{"internal address", "CONNECT loopback.allowed.test:443 HTTP/1.1\r\nHost: x\r\n\r\n", pipelined},
		{"bad target", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", pipelined},
	}
	want := map[string][3]any{
		cases[0].name: {403, "not_allowlisted", ""}, cases[1].name: {403, "not_allowlisted", ""},
		cases[2].name: {403, "internal_address", "loopback"}, cases[3].name: {400, "bad_request", "connect_target"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, br := w.dialProxy(t)
			wt := want[tc.name]
			sendRefusedThenClosed(t, c, br, tc.head+tc.ahead, wt[0].(int), wt[1].(string), wt[2].(string))
		})
	}
	w.assertUpstreamSawNothing(t)
}

// clientHelloBytes is a real ClientHello for sni, as an optimistic client sends it.
func clientHelloBytes(t *testing.T, sni string) string {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		tls.Client(b, &tls.Config{ServerName: sni}).Handshake()
		b.Close()
	}()
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16<<10)
	n, err := a.Read(buf)
	if err != nil || n < 5 || buf[0] != 0x16 {
		t.Fatalf("no ClientHello: %v", err)
	}
	return string(buf[:n])
}

// TestTransparentEdges: on a transparent listener's plain HTTP, an h2c upgrade and
// a CONNECT are refused and the connection is closed; inside a transparently
// intercepted TLS connection the h2c upgrade is refused the same way.
func TestTransparentEdges(t *testing.T) {
	w, sb := newTransparentWorld(t)
	plain := func(t *testing.T) (net.Conn, *bufio.Reader) {
		c, err := sb.dial(t, "tcp", w.PublicIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	ahead := "GET /pipelined HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n"
	for name, hdr := range h2cUpgrades {
		t.Run("plain h2c "+name, func(t *testing.T) {
			c, br := plain(t)
			sendRefusedThenClosed(t, c, br, "GET / HTTP/1.1\r\nHost: www.allowed.test\r\n"+hdr+"\r\n"+h2cPreface+ahead,
				400, "bad_request", "h2c_upgrade")
		})
	}
	t.Run("CONNECT as a plain-HTTP method", func(t *testing.T) {
		c, br := plain(t)
		sendRefusedThenClosed(t, c, br, "CONNECT www.allowed.test:80 HTTP/1.1\r\nHost: www.allowed.test:80\r\n\r\n"+ahead,
			400, "bad_request", "connect_transparent")
	})
	t.Run("CONNECT inside intercepted TLS", func(t *testing.T) {
		tc, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", "api.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		sendRefusedThenClosed(t, tc, bufio.NewReader(tc), "CONNECT api.allowed.test:443 HTTP/1.1\r\nHost: api.allowed.test:443\r\n\r\n"+
			"GET /pipelined HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", 400, "bad_request", "connect_in_tunnel")
	})
	t.Run("h2c inside intercepted TLS", func(t *testing.T) {
		tc, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", "api.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		sendRefusedThenClosed(t, tc, bufio.NewReader(tc), "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\n"+
			"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"+h2cPreface, 400, "bad_request", "h2c_upgrade")
	})
	w.assertUpstreamSawNothing(t)
	w.assertSecretNotLogged()
}
