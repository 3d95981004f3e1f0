package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"golang.org/x/net/websocket"
)

// secretToken is the credential the tests inject; it must appear nowhere but in the
// Authorization header the upstream receives.
const secretToken = "tok-3f9a1c-never-leaks"

// staticValue is the transform's value: injected, so masked in responses too.
const staticValue = "static-value"

// injectEntries: api.allowed.test injects a credential and a transform; other.test
// sits under "*" and must never receive them.
var injectEntries = []allowlist.Entry{
	{Domain: "api.allowed.test", Credential: "api", Transform: []allowlist.Header{{Name: "X-Static", Value: staticValue}}},
	{Domain: "*.allowed.test"},
	{Domain: "*"},
}

func newInjectWorld(t *testing.T, o worldOpts) *world {
	if o.allowlist == nil {
		o.allowlist = injectEntries
	}
	if o.credentials == nil {
		o.credentials = map[string]string{"api": `{"token": "` + secretToken + `"}`}
	}
	return newWorld(t, o)
}

func TestInjectionReplacesClientCopies(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	req, _ := http.NewRequest("GET", "https://api.allowed.test/v1", nil)
	req.Header["Authorization"] = []string{"Bearer client-one", "Bearer client-two"}
	req.Header["authorization"] = []string{"lowercase-copy"}
	req.Header.Set("X-Static", "client-static")
	req.Header.Set("Egressd-Hook-Assertion", "forged")
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := decodeEcho(t, resp)
	if a := got.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer "+secretMark {
		t.Errorf("upstream Authorization = %q, want exactly the injected one", a)
	}
	if s := got.Header.Values("X-Static"); len(s) != 1 || s[0] != staticMark {
		t.Errorf("upstream X-Static = %q", s)
	}
	if got.Header.Get("Egressd-Hook-Assertion") != "" {
		t.Error("Egressd-* header from the sandbox reached the upstream")
	}
	line := w.lastLog("")
	if line["intercepted"] != true || line["credential"] != "api" || line["credential_version"] == "" {
		t.Errorf("log line: %v", line)
	}
	if inj, _ := json.Marshal(line["injected"]); string(inj) != `["X-Static","Authorization"]` && string(inj) != `["Authorization","X-Static"]` {
		t.Errorf("injected = %s", inj)
	}
	w.assertSecretNotLogged()
}

func TestInjectionOverHTTP2AndTrailers(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rw.Header().Set("Trailer", "Grpc-Status")
		json.NewEncoder(rw).Encode(echoed{Method: r.Method, Host: r.Host, Proto: r.Proto,
			Header: markInjected(r.Header), Body: r.Trailer.Get("X-Checksum") + "|" + strings.Join(r.Trailer.Values("X-Static"), ",")})
		rw.Header().Set("Grpc-Status", "0")
	})
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "https://api.allowed.test/stream", pr)
	req.Header.Set("Authorization", "Bearer client")
	// HTTP/2 refuses Authorization as a trailer outright (RFC 9110 §6.5.1), so the
	// smuggling attempt uses the transform's header, X-Static.
	req.Trailer = http.Header{"X-Static": nil, "X-Checksum": nil}
	go func() {
		io.WriteString(pw, "payload")
		req.Trailer.Set("X-Static", "trailer-smuggled")
		req.Trailer.Set("X-Checksum", "c0ffee")
		pw.Close()
	}()
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	var got echoed
	json.NewDecoder(resp.Body).Decode(&got)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if a := got.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer "+secretMark {
		t.Errorf("upstream Authorization = %q", a)
	}
	if got.Body != "c0ffee|" {
		t.Errorf("upstream trailers (X-Checksum|X-Static) = %q, want the checksum only: an injected name must not pass as a trailer", got.Body)
	}
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("response trailer Grpc-Status = %q, want 0", resp.Trailer.Get("Grpc-Status"))
	}
}

func TestStarEntryNeverGetsAnotherEntrysCredential(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	for _, u := range []string{"https://other.test/", "https://www.allowed.test/"} {
		resp, err := w.interceptingClient().Get(u)
		if err != nil {
			t.Fatal(err)
		}
		got := decodeEcho(t, resp)
		if v := got.Header.Get("Authorization"); v != "" {
			t.Errorf("%s: upstream received Authorization %q", u, v)
		}
		if got.Header.Get("X-Static") != "" {
			t.Errorf("%s: upstream received X-Static", u)
		}
	}
}

func TestPlaintextCredentialRefused(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	resp := w.raw("GET http://api.allowed.test/ HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
	assertRefused(t, resp, 403, "plaintext_credential", "")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d request(s)", n)
	}
}

// TestFrontingAndRetargeting: every way of naming another host inside a tunnel is
// refused, and the other host sees nothing.
func TestFrontingAndRetargeting(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	t.Run("SNI of another host, intercepted", func(t *testing.T) {
		w.assertSNIRefused(t, "api.allowed.test:443", "other.test")
	})
	t.Run("SNI of another host, spliced", func(t *testing.T) {
		w.assertSNIRefused(t, "www.allowed.test:443", "api.allowed.test")
	})
	cases := []struct{ name, head string }{
		{"inner Host of another host", "GET /x HTTP/1.1\r\nHost: other.test\r\n\r\n"},
		{"inner Host with another port", "GET /x HTTP/1.1\r\nHost: api.allowed.test:8443\r\n\r\n"},
		{"absolute-form URL of another host", "GET https://other.test/x HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc2, br := w.interceptedH1(t, "api.allowed.test")
			io.WriteString(tc2, tc.head)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			assertRefused(t, resp, 421, "host_mismatch", "")
		})
	}
	t.Run("second keep-alive request to another host", func(t *testing.T) {
		tc2, br := w.interceptedH1(t, "api.allowed.test")
		io.WriteString(tc2, "GET /first HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		decodeEcho(t, resp)
		io.WriteString(tc2, "GET /second HTTP/1.1\r\nHost: other.test\r\n\r\n")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		assertRefused(t, resp, 421, "host_mismatch", "")
	})
	t.Run("HTTP/2 :authority of another host", func(t *testing.T) {
		cc := w.h2ClientConn(t, "api.allowed.test:443")
		req, _ := http.NewRequest("GET", "https://other.test/x", nil)
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		assertRefused(t, resp, 421, "host_mismatch", "")
	})
	if n := w.Upstream.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want only the one allowed first request", n)
	}
}

func TestWebSocketUpgradeGetsInjectedHeader(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(rw, "want upgrade", 400)
			return
		}
		wsEcho(rw, r, markValues(r.Header.Get("Authorization")))
	})
	ws := w.websocket(t, http.Header{"Authorization": {"Bearer client"}})
	defer ws.Close()
	var first, echo string
	if websocket.Message.Receive(ws, &first); first != "Bearer "+secretMark {
		t.Errorf("upgrade request carried Authorization %q", first)
	}
	websocket.Message.Send(ws, "hello")
	if websocket.Message.Receive(ws, &echo); echo != "echo:hello" {
		t.Errorf("echo = %q", echo)
	}
}

func TestInterceptedStreamingFirstEvent(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	release := make(chan struct{})
	defer close(release)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(rw, "data: first\n\n")
		rw.(http.Flusher).Flush()
		<-release
	})
	for _, proto := range []string{"http/1.1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			c := w.interceptingClient()
			if proto == "h2" {
				c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
			}
			start := time.Now()
			resp, err := c.Get("https://api.allowed.test/events")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || line != "data: first\n" {
				t.Fatalf("first event %q, %v", line, err)
			}
			t.Logf("%s first event after %v", resp.Proto, time.Since(start))
		})
	}
}

func TestInterceptedUpstreamUnknownCA(t *testing.T) {
	w := newInjectWorld(t, worldOpts{untrustedUpstream: true})
	resp, err := w.interceptingClient().Get("https://api.allowed.test/")
	if err != nil {
		t.Fatal(err)
	}
	assertRefused(t, resp, 502, "upstream_tls", "")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream served %d request(s)", n)
	}
}

// TestCredentialFileLossFailsClosed: the last good value is served until max_stale,
// then 503 credential_unavailable, and no request reaches the upstream without it.
func TestCredentialFileLossFailsClosed(t *testing.T) {
	for _, damage := range []string{"deleted", "corrupted"} {
		t.Run(damage, func(t *testing.T) {
			w := newInjectWorld(t, worldOpts{maxStale: 700 * time.Millisecond})
			c := w.interceptingClient()
			resp, err := c.Get("https://api.allowed.test/before")
			if err != nil {
				t.Fatal(err)
			}
			decodeEcho(t, resp)
			if damage == "deleted" {
				os.Remove(w.credFile)
			} else {
				os.WriteFile(w.credFile, []byte("{not json"), 0o600)
			}
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				resp, err := c.Get("https://api.allowed.test/during")
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode == 503 {
					assertRefused(t, resp, 503, "credential_unavailable", "")
					w.assertUpstreamAlwaysGotToken()
					return
				}
				got := decodeEcho(t, resp) // served with the last good value
				if got.Header.Get("Authorization") != "Bearer "+secretMark {
					t.Fatalf("forwarded without the credential: %v", got.Header)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Fatal("credential still served long after max_stale")
		})
	}
}

// connect opens a CONNECT tunnel through the proxy and returns the raw connection.
func (w *world) connect(t *testing.T, authority string) net.Conn {
	t.Helper()
	c, _ := w.connectResp(t, authority)
	return c
}

// connectResp is connect that also returns egressd's 200.
func (w *world) connectResp(t *testing.T, authority string) (net.Conn, *http.Response) {
	t.Helper()
	c, br := w.dialProxy(t)
	io.WriteString(c, "CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", authority, resp, err)
	}
	return &replayConn{Conn: c, br: br}, resp
}

// h2ClientConn opens an HTTP/2-only client connection to authority through a
// CONNECT tunnel; requests on it may name any :authority.
func (w *world) h2ClientConn(t *testing.T, authority string) *http.ClientConn {
	t.Helper()
	tr := w.interceptingClient().Transport.(*http.Transport)
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP2(true)
	cc, err := tr.NewClientConn(context.Background(), "https", authority)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// interceptedH1 opens an intercepted HTTP/1.1 tunnel to host.
func (w *world) interceptedH1(t *testing.T, host string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	return w.tlsH1(t, host, w.CAPool)
}

// tlsH1 opens a CONNECT tunnel to host:443 and speaks TLS (HTTP/1.1) in it,
// trusting roots: egressd's CA where the tunnel is intercepted, the upstream's
// where it is spliced.
func (w *world) tlsH1(t *testing.T, host string, roots *x509.CertPool) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	tc := tls.Client(w.connect(t, host+":443"), &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc, bufio.NewReader(tc)
}

func (w *world) assertSNIRefused(t *testing.T, authority, sni string) {
	t.Helper()
	before := w.Upstream.requests.Load()
	tc := tls.Client(w.connect(t, authority), &tls.Config{ServerName: sni, RootCAs: w.CAPool, InsecureSkipVerify: false})
	err := tc.HandshakeContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("handshake with SNI %s in a tunnel to %s: %v, want alert unrecognized_name", sni, authority, err)
	}
	if line := w.lastLog(""); line["reason"] != "host_mismatch" {
		t.Errorf("log reason %v, want host_mismatch", line["reason"])
	}
	if w.Upstream.requests.Load() != before {
		t.Error("the upstream saw a request")
	}
}

// interceptingClient trusts egressd's CA: intercepted tunnels are terminated by
// egressd, spliced ones by the upstream (whose CA it trusts too).
func (w *world) interceptingClient() *http.Client {
	c := w.client()
	pool := w.CAPool.Clone()
	pool.AppendCertsFromPEM(w.upstreamCAPEM)
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	return c
}

// assertSecretNotLogged fails if the injected secret appears in any log line.
func (w *world) assertSecretNotLogged() {
	w.t.Helper()
	if strings.Contains(string(w.logs.Bytes()), secretToken) {
		w.t.Error("the secret appears in the log")
	}
}

// assertUpstreamAlwaysGotToken fails if the upstream ever saw a request to the
// credential's host without the injected token.
func (w *world) assertUpstreamAlwaysGotToken() {
	w.t.Helper()
	if n := w.Upstream.withoutToken.Load(); n != 0 {
		w.t.Errorf("upstream saw %d request(s) to api.allowed.test without the credential", n)
	}
}

type replayConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.br.Read(p) }

// TestChunkedTrailerCannotCarryInjectedHeader sends a chunked HTTP/1.1 body whose
// trailer names the injected header: the upstream (HTTP/1.1, where trailers pass
// freely) receives the harmless trailer and never the smuggled one.
func TestChunkedTrailerCannotCarryInjectedHeader(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: []allowlist.Entry{{Domain: "plain.allowed.test",
		Transform: []allowlist.Header{{Name: "X-Static", Value: staticValue}}, AllowPlaintext: true}}})
	w.DNS.Set("plain.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		json.NewEncoder(rw).Encode(echoed{Header: markInjected(r.Header), Body: r.Trailer.Get("X-Checksum") + "|" + strings.Join(r.Trailer.Values("X-Static"), ",")})
	})
	resp := w.raw("POST http://plain.allowed.test/upload HTTP/1.1\r\nHost: plain.allowed.test\r\n" +
		"Transfer-Encoding: chunked\r\nTrailer: X-Static, X-Checksum\r\n\r\n" +
		"7\r\npayload\r\n0\r\nX-Static: smuggled\r\nX-Checksum: c0ffee\r\n\r\n")
	got := decodeEcho(t, resp)
	if got.Header.Get("X-Static") != staticMark {
		t.Errorf("X-Static header = %q", got.Header.Get("X-Static"))
	}
	if got.Body != "c0ffee|" {
		t.Errorf("upstream trailers (X-Checksum|X-Static) = %q, want the checksum only", got.Body)
	}
}
