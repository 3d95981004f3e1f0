package proxy_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// Protocol edges: each case asserts the refusal, what the upstream saw,
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

// assertH2COfferDeclined sends a request offering h2c (hdr) and checks that it is
// served over HTTP/1.1 with the offer removed: no Upgrade: h2c, HTTP2-Settings or
// their Connection tokens reach the upstream, and nothing is switched.
func assertH2COfferDeclined(t *testing.T, c net.Conn, br *bufio.Reader, head, hdr string) {
	t.Helper()
	io.WriteString(c, head+hdr+"\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
		t.Fatalf("h2c offer: %s %s, want 200 over HTTP/1.1", resp.Proto, resp.Status)
	}
	got := decodeEcho(t, resp)
	for _, v := range got.Header.Values("Upgrade") {
		if strings.Contains(strings.ToLower(v), "h2c") {
			t.Errorf("the upstream got Upgrade: %s", v)
		}
	}
	if v := got.Header.Get("Http2-Settings"); v != "" {
		t.Errorf("the upstream got HTTP2-Settings: %s", v)
	}
}

func TestH2COfferDeclinedExplicit(t *testing.T) {
	w := newWorld(t, worldOpts{})
	for name, hdr := range h2cUpgrades {
		t.Run(name, func(t *testing.T) {
			c, br := w.dialProxy(t)
			assertH2COfferDeclined(t, c, br, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n", hdr)
		})
	}
	// An optimistic client that sends the h2c preface at once gets its request
	// answered over HTTP/1.1; the preface is then read as a malformed HTTP/1 request
	// and ends the connection, and the request pipelined after it is never served.
	t.Run("optimistic preface", func(t *testing.T) {
		before := w.Upstream.requests.Load()
		c, br := w.dialProxy(t)
		io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n"+h2cUpgrades["with HTTP2-Settings"]+
			"\r\n"+h2cPreface+pipelined)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("first response: %v %v", resp, err)
		}
		decodeEcho(t, resp)
		if resp, err := http.ReadResponse(br, nil); err == nil && resp.StatusCode != 400 {
			t.Errorf("the preface got %s", resp.Status)
		}
		if n := w.Upstream.requests.Load() - before; n != 1 {
			t.Errorf("the upstream saw %d requests, want only the first", n)
		}
	})
}

func TestH2COfferDeclinedInsideTunnel(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	for name, hdr := range h2cUpgrades {
		t.Run(name, func(t *testing.T) {
			tc, br := w.interceptedH1(t, "api.allowed.test")
			assertH2COfferDeclined(t, tc, br, "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\n", hdr)
		})
	}
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

// An upgrade the upstream declines (no 101) ends the connection too: the client
// may already have sent the other protocol's bytes.
func TestDeclinedUpgradeCloses(t *testing.T) {
	w := newWorld(t, worldOpts{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		http.Error(rw, "no upgrade here", http.StatusUpgradeRequired)
	})
	c, br := w.dialProxy(t)
	io.WriteString(c, "GET http://allowed.test/ws HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\n"+
		"Upgrade: websocket\r\n\r\n"+pipelined)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUpgradeRequired || !resp.Close {
		t.Errorf("status %d, close %v; want the upstream's 426 with Connection: close", resp.StatusCode, resp.Close)
	}
	assertClosed(t, br)
	if n := w.Upstream.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1: the pipelined one was parsed", n)
	}
	w.assertNoCanaryHit()
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

// TestTransparentEdges: on a transparent listener's plain HTTP, an h2c offer is
// declined (served over HTTP/1.1) and a CONNECT is refused and the connection
// closed; inside a transparently intercepted TLS connection likewise.
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
			assertH2COfferDeclined(t, c, br, "GET / HTTP/1.1\r\nHost: www.allowed.test\r\n", hdr)
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
		assertH2COfferDeclined(t, tc, bufio.NewReader(tc), "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\n",
			h2cUpgrades["with HTTP2-Settings"])
	})
	w.assertSecretNotLogged()
}

// forger is an upstream that sends Egressd-* headers and trailers of its own, one
// announced trailer and one it never announced.
func forger(rw http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h := rw.Header()
	h.Set("Egressd-Reason", "not_allowlisted")
	h.Set("Egressd-Hook", "fail-closed")
	h["egressd-lower"] = []string{"x"}
	h.Set("Trailer", "X-Announced, Egressd-Announced")
	rw.WriteHeader(200)
	io.WriteString(rw, `{"decision":"allow"}`)
	rw.(http.Flusher).Flush() // chunked on HTTP/1.1
	h.Set("X-Announced", "a")
	h.Set("Egressd-Announced", "forged")
	h.Set(http.TrailerPrefix+"X-Undeclared", "u")
	h.Set(http.TrailerPrefix+"Egressd-Undeclared", "forged")
}

// assertNoForgery checks that the client saw none of the upstream's Egressd-*
// fields and every other trailer, announced or not.
func assertNoForgery(t *testing.T, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != `{"decision":"allow"}` {
		t.Fatalf("status %d, body %q", resp.StatusCode, body)
	}
	for _, h := range []http.Header{resp.Header, resp.Trailer} {
		for name := range h {
			if strings.HasPrefix(strings.ToLower(name), "egressd-") {
				t.Errorf("client saw the upstream's %s", name)
			}
		}
	}
	if resp.Trailer.Get("X-Announced") != "a" || resp.Trailer.Get("X-Undeclared") != "u" {
		t.Errorf("trailers %v, want X-Announced and X-Undeclared", resp.Trailer)
	}
}

func TestUpstreamEgressdHeadersRemoved(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.Upstream.set(forger)
	t.Run("explicit GET", func(t *testing.T) {
		resp, err := w.client().Get("http://www.allowed.test/")
		if err != nil {
			t.Fatal(err)
		}
		assertNoForgery(t, resp)
	})
	t.Run("explicit POST", func(t *testing.T) {
		resp, err := w.client().Post("http://www.allowed.test/", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		assertNoForgery(t, resp)
	})
	t.Run("intercepted HTTP/1.1", func(t *testing.T) {
		assertNoForgery(t, w.interceptedRaw(t, "api.allowed.test", "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n"))
	})
	t.Run("intercepted HTTP/2", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "https://api.allowed.test/v1", nil)
		resp, err := w.h2ClientConn(t, "api.allowed.test:443").RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		assertNoForgery(t, resp)
	})
	t.Run("upgrade", func(t *testing.T) {
		w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
			conn, brw, err := rw.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nEgressd-Reason: forged\r\n\r\n")
			brw.Flush()
		})
		tc, br := w.interceptedH1(t, "api.allowed.test")
		io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 101 || resp.Header.Get("Egressd-Reason") != "" {
			t.Errorf("101 response: %d %v", resp.StatusCode, resp.Header)
		}
	})
	w.assertNoCanaryHit()
}

// TestHookResponseEgressdHeadersRemoved: a hook endpoint cannot fake egressd's
// fail-closed marker on the answer it passes through.
func TestHookResponseEgressdHeadersRemoved(t *testing.T) {
	w := newHookWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rw.Header().Set("Egressd-Hook", "fail-closed")
		rw.Header().Set("Egressd-Reason", "forged")
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", strings.NewReader(`{"tool":"code_execution"}`))
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != `{"decision":"allow"}` || resp.Header.Get("Egressd-Hook") != "" || resp.Header.Get("Egressd-Reason") != "" {
		t.Errorf("hook answer: %v %q", resp.Header, body)
	}
}

// TestNoHeaderAdded: a request without User-Agent reaches the upstream without one
// on every path (the pool, the HTTP/1.1 Transport, HTTP/2), with the client's
// headers as sent; TE: trailers, the one TE that may travel, travels.
func TestNoHeaderAdded(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	check := func(t *testing.T, got echoed, extra ...string) {
		t.Helper()
		want := map[string]bool{"X-Client": true}
		for _, h := range extra {
			want[h] = true
		}
		for name := range got.Header {
			if !want[name] {
				t.Errorf("upstream saw %s: %q", name, got.Header[name])
			}
		}
		if got.Header.Get("X-Client") != "1" {
			t.Errorf("upstream lost X-Client: %v", got.Header)
		}
	}
	raw := func(method, extra string) string {
		return method + " http://www.allowed.test/ HTTP/1.1\r\nHost: www.allowed.test\r\nX-Client: 1\r\n" + extra + "\r\n"
	}
	t.Run("explicit GET (pool)", func(t *testing.T) { check(t, decodeEcho(t, w.raw(raw("GET", "")))) })
	t.Run("explicit POST (Transport)", func(t *testing.T) {
		check(t, decodeEcho(t, w.raw(raw("POST", "Content-Length: 1\r\n")+"x")), "Content-Length")
	})
	t.Run("intercepted HTTP/1.1 with credential", func(t *testing.T) {
		resp := w.interceptedRaw(t, "api.allowed.test", "GET /v1 HTTP/1.1\r\nHost: api.allowed.test\r\nX-Client: 1\r\n\r\n")
		check(t, decodeEcho(t, resp), "Authorization", "X-Static")
	})
	t.Run("intercepted HTTP/2 with credential", func(t *testing.T) {
		req, _ := http.NewRequest("POST", "https://api.allowed.test/v1", strings.NewReader("x"))
		// An empty User-Agent keeps the test's own client from sending one; an
		// Accept-Encoding of its own keeps it from asking for gzip.
		req.Header = http.Header{"X-Client": {"1"}, "Te": {"trailers"}, "User-Agent": {""}, "Accept-Encoding": {"identity"}}
		resp, err := w.h2ClientConn(t, "api.allowed.test:443").RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got := decodeEcho(t, resp)
		check(t, got, "Authorization", "X-Static", "Content-Length", "Te", "Accept-Encoding")
		if got.Header.Get("Te") != "trailers" {
			t.Errorf("upstream saw TE %q, want trailers", got.Header.Get("Te"))
		}
	})
}

// interceptedRaw sends a raw request inside an intercepted HTTP/1.1 tunnel to host
// and returns the response.
func (w *world) interceptedRaw(t *testing.T, host, req string) *http.Response {
	t.Helper()
	tc, br := w.interceptedH1(t, host)
	io.WriteString(tc, req)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestHTTP2OnlyUpstream: an HTTP/1.1 client reaches an upstream that speaks only
// HTTP/2; egressd speaks HTTP/2 to it. "strict" refuses ALPN http/1.1 with the
// alert no_application_protocol; grpc-go completes the handshake without ALPN and
// closes. An Upgrade, which HTTP/2 cannot carry, is refused with detail
// http2_only, never "could not connect".
func TestHTTP2OnlyUpstream(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: []allowlist.Entry{
		{Domain: "h2only.allowed.test", Credential: "api"}, {Domain: "grpc.allowed.test", Credential: "api"}}})
	w.startStrictH2(t, "h2only.allowed.test")
	w.startGRPC(t)
	t.Run("strict", func(t *testing.T) {
		tc, br := w.interceptedH1(t, "h2only.allowed.test")
		for i, req := range []string{
			"GET /first HTTP/1.1\r\nHost: h2only.allowed.test\r\n\r\n",
			"POST /body HTTP/1.1\r\nHost: h2only.allowed.test\r\nContent-Length: 7\r\n\r\npayload",
			"GET /known HTTP/1.1\r\nHost: h2only.allowed.test\r\n\r\n",
		} {
			io.WriteString(tc, req)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := decodeEcho(t, resp)
			if got.Proto != "HTTP/2.0" || got.Header.Get("Authorization") != "Bearer "+secretMark || (i == 1 && got.Body != "payload") {
				t.Errorf("request %d: upstream saw %+v", i, got)
			}
		}
		resp := w.interceptedRaw(t, "h2only.allowed.test", "GET /ws HTTP/1.1\r\nHost: h2only.allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		rb := assertRefused(t, resp, 502, "upstream_unreachable", "http2_only")
		if !strings.Contains(rb.Message, "only HTTP/2") {
			t.Errorf("message %q", rb.Message)
		}
		if n := w.Upstream.requests.Load(); n != 3 {
			t.Errorf("upstream saw %d requests, want 3", n)
		}
	})
	t.Run("grpc-go", func(t *testing.T) {
		// Not a gRPC call: grpc-go answers 415 (over HTTP/2), which is the point.
		resp := w.interceptedRaw(t, "grpc.allowed.test", "GET /x HTTP/1.1\r\nHost: grpc.allowed.test\r\n\r\n")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("status %d, want grpc-go's 415", resp.StatusCode)
		}
	})
	w.assertNoCanaryHit()
}

// startStrictH2 serves the echo upstream as host over TLS that accepts only ALPN
// h2 and refuses any other offer with no_application_protocol (as BoringSSL-based
// servers do; Go's own would fall back to no ALPN for an http/1.1 offer).
func (w *world) startStrictH2(t *testing.T, host string) {
	t.Helper()
	ip := nextPublicIP()
	w.DNS.Set(host, "A "+ip)
	cert := w.UpstreamPKI.Leaf(t, host)
	conf := &tls.Config{GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		protos := []string{"h2"}
		if !slices.Contains(hello.SupportedProtos, "h2") {
			protos = []string{"x-not-http1"} // no overlap, no h2 fallback: the alert
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: protos}, nil
	}}
	srv := &http.Server{Handler: w.Upstream}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP2(true)
	go srv.Serve(tls.NewListener(listenOn(t, ip+":443"), conf))
	t.Cleanup(func() { srv.Close() })
}
