package conformance_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/testpki"
)

// TestFrontingAndRetargeting: inside a tunnel the policy host is the CONNECT
// target. Every way of naming another host in it (the SNI, the inner Host, an
// absolute-form URL, HTTP/2's :authority, a later keep-alive request) is refused:
// a TLS alert for the SNI, 421 host_mismatch for a request. The other host, and
// the credential host's upstream for a request that named another, see nothing.
func TestFrontingAndRetargeting(t *testing.T) {
	w := newWorld(t, config{})
	sni := []struct{ name, authority, sni, alpn string }{
		{"SNI of another host, intercepted, HTTP/1.1", "api.allowed.test:443", "evil.test", "http/1.1"},
		{"SNI of another host, intercepted, HTTP/2", "api.allowed.test:443", "evil.test", "h2"},
		{"SNI of another allowlisted host, intercepted", "api.allowed.test:443", "www.allowed.test", "h2"},
		{"SNI of another host, spliced", "allowed.test:443", "evil.test", "http/1.1"},
		{"SNI of the credential host in a spliced tunnel", "www.allowed.test:443", "api.allowed.test", "h2"},
		{"SNI of a lookalike, spliced", "allowed.test:443", lookalikeASCII, "http/1.1"},
	}
	for _, tc := range sni {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			_, err := k.tlsOver(k.connect(tc.authority), tc.sni, tc.alpn)
			if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
				t.Fatalf("handshake with SNI %s in a tunnel to %s: %v, want the alert unrecognized_name", tc.sni, tc.authority, err)
			}
			k.waitLog(func(l map[string]any) bool {
				return l["method"] == "CONNECT" && l["reason"] == "host_mismatch" && l["host"] == strings.Split(tc.authority, ":")[0]
			})
			k.assertUpstreamSaw(0)
		})
	}

	t.Run("SNI of another host in a ClientHello split over TLS records and writes", func(t *testing.T) {
		k := w.begin(t)
		c := k.connect("allowed.test:443")
		hello := fragmentRecords(clientHello(t, "evil.test"), 64)
		for len(hello) > 0 {
			n := min(len(hello), 16)
			if _, err := c.Write(hello[:n]); err != nil {
				break // egressd may answer before the last fragment
			}
			hello = hello[n:]
			time.Sleep(time.Millisecond)
		}
		alert := make([]byte, 7)
		if _, err := io.ReadFull(c, alert); err != nil || alert[0] != 21 || alert[6] != 112 {
			t.Fatalf("read %x, %v; want the alert unrecognized_name", alert, err)
		}
		k.waitLog(func(l map[string]any) bool {
			return l["method"] == "CONNECT" && l["reason"] == "host_mismatch" && l["host"] == "allowed.test"
		})
		k.assertUpstreamSaw(0)
	})

	h1 := []struct{ name, head, detail string }{
		{"inner Host of another host", "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", "host"},
		{"inner Host of another allowlisted host", "GET /x HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n", "host"},
		{"inner Host with another port", "GET /x HTTP/1.1\r\nHost: api.allowed.test:8443\r\n\r\n", "host"},
		{"inner Host of a lookalike", "GET /x HTTP/1.1\r\nHost: " + lookalikeUnicode + "\r\n\r\n", "host"},
		{"absolute-form URL of another host", "GET https://evil.test/x HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", "url"},
		{"absolute-form URL with another port", "GET https://api.allowed.test:8443/x HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", "url"},
		{"absolute-form URL with userinfo of the target", "GET https://api.allowed.test@evil.test/x HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", "url"},
	}
	for _, tc := range h1 {
		t.Run(tc.name+", HTTP/1.1", func(t *testing.T) {
			k := w.begin(t)
			c := k.intercepted("api.allowed.test")
			k.send(c, tc.head)
			k.refused(k.response(c, http.MethodGet), 421, "host_mismatch", tc.detail)
			k.assertUpstreamSaw(0)
		})
	}
	t.Run("request without Host inside a tunnel", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("api.allowed.test")
		k.send(c, "GET /x HTTP/1.0\r\n\r\n")
		k.refused(k.response(c, http.MethodGet), 400, "bad_request", "missing_host")
		k.assertUpstreamSaw(0)
	})
	t.Run("CONNECT inside an intercepted tunnel", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("api.allowed.test")
		k.send(c, "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
		k.refused(k.response(c, http.MethodConnect), 400, "bad_request", "connect_in_tunnel")
		k.assertUpstreamSaw(0)
	})
	t.Run("second keep-alive request to another host, HTTP/1.1", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("api.allowed.test")
		k.send(c, "GET /first HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
		k.assertInjected(k.echo(k.response(c, http.MethodGet)).Header)
		k.send(c, "GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n")
		k.refused(k.response(c, http.MethodGet), 421, "host_mismatch", "host")
		k.send(c, "GET https://www.allowed.test/third HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
		k.refused(k.response(c, http.MethodGet), 421, "host_mismatch", "url")
		k.assertUpstreamSaw(1)
	})
	t.Run("second pipelined request to another host, HTTP/1.1", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("api.allowed.test")
		k.send(c, "GET /first HTTP/1.1\r\nHost: api.allowed.test\r\n\r\nGET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n")
		k.assertInjected(k.echo(k.response(c, http.MethodGet)).Header)
		k.refused(k.response(c, http.MethodGet), 421, "host_mismatch", "host")
		k.assertUpstreamSaw(1)
	})

	h2 := []struct{ name, url string }{
		{":authority of another host", "https://evil.test/x"},
		{":authority of another allowlisted host", "https://www.allowed.test/x"},
		{":authority with another port", "https://api.allowed.test:8443/x"},
	}
	for _, tc := range h2 {
		t.Run(tc.name+", HTTP/2", func(t *testing.T) {
			k := w.begin(t)
			req, _ := http.NewRequest(http.MethodGet, tc.url, nil)
			resp, err := k.h2("api.allowed.test:443").RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			k.refused(resp, 421, "host_mismatch", "")
			k.assertUpstreamSaw(0)
		})
	}
	t.Run("second stream to another host, HTTP/2", func(t *testing.T) {
		k := w.begin(t)
		cc := k.h2("api.allowed.test:443")
		for i, u := range []string{"https://api.allowed.test/first", "https://evil.test/second", "https://api.allowed.test/third"} {
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if i == 1 {
				k.refused(resp, 421, "host_mismatch", "")
				continue
			}
			k.assertInjected(k.echo(resp).Header)
		}
		k.assertUpstreamSaw(2)
	})
}

// clientHello returns the first flight crypto/tls's client writes for sni.
func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	w := &captureConn{}
	err := tls.Client(w, &tls.Config{ServerName: sni, NextProtos: []string{"h2", "http/1.1"}}).Handshake()
	if !errors.Is(err, errCaptured) || w.buf.Len() < 5 {
		t.Fatalf("no ClientHello for %q: %v", sni, err)
	}
	return w.buf.Bytes()
}

// fragmentRecords re-frames one TLS handshake record as several records of at
// most n bytes of payload each (RFC 8446 §5.1 allows a handshake message to span
// records), so that the SNI lies past the first record.
func fragmentRecords(record []byte, n int) []byte {
	header, payload := record[:5], record[5:]
	var out []byte
	for len(payload) > 0 {
		m := min(len(payload), n)
		out = append(out, header[0], header[1], header[2], byte(m>>8), byte(m))
		out = append(out, payload[:m]...)
		payload = payload[m:]
	}
	return out
}

var errCaptured = errors.New("ClientHello captured")

// captureConn keeps what a TLS client writes and ends its handshake at the first read.
type captureConn struct{ buf bytes.Buffer }

func (c *captureConn) Read([]byte) (int, error)         { return 0, errCaptured }
func (c *captureConn) Write(b []byte) (int, error)      { return c.buf.Write(b) }
func (c *captureConn) Close() error                     { return nil }
func (c *captureConn) LocalAddr() net.Addr              { return nil }
func (c *captureConn) RemoteAddr() net.Addr             { return nil }
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }

// waitLog waits briefly for a canonical egress line that match accepts.
func (k *kase) waitLog(match func(map[string]any) bool) map[string]any {
	k.t.Helper()
	for range 200 {
		for _, l := range k.w.egressLines() {
			if match(l) {
				return l
			}
		}
		sleepTick()
	}
	k.t.Fatal("no matching egress log line")
	return nil
}

// TestSplicedClientHelloRules: a spliced tunnel is never read after its
// ClientHello, so the hello may name nothing beyond the SNI egressd checked. A named
// target without SNI is refused (host_mismatch/no_sni); a hello carrying Encrypted
// Client Hello, whose inner name could be any tenant of the edge, is intercepted
// (egressd's CA is trusted here): a real ECH client sees its ECH rejected by egressd
// and reaches nothing.
func TestSplicedClientHelloRules(t *testing.T) {
	w := newWorld(t, config{})
	t.Run("no SNI to a named target", func(t *testing.T) {
		k := w.begin(t)
		tc := tls.Client(k.connect("allowed.test:443"), &tls.Config{ServerName: publicIP, RootCAs: w.roots})
		if err := tc.Handshake(); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
			t.Fatalf("handshake without SNI: %v, want the alert unrecognized_name", err)
		}
		k.waitLog(func(l map[string]any) bool {
			return l["method"] == "CONNECT" && l["reason"] == "host_mismatch" && l["detail"] == "no_sni"
		})
		k.assertUpstreamSaw(0)
	})
	t.Run("Encrypted Client Hello naming another tenant", func(t *testing.T) {
		k := w.begin(t)
		ech := testpki.NewECH(t, "allowed.test")
		tc := tls.Client(k.connect("allowed.test:443"), &tls.Config{ServerName: "evil.test", RootCAs: w.roots,
			MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: ech.ConfigList})
		var rejected *tls.ECHRejectionError
		if err := tc.Handshake(); !errors.As(err, &rejected) {
			t.Fatalf("handshake: %v, want the ECH rejected by egressd's interception", err)
		}
		k.assertUpstreamSaw(0)
	})
}
