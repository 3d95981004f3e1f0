package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// peekTimeout bounds one peek in the fuzzer: its input is a bytes.Reader, which
// never blocks, so a peek that takes this long is stuck in a loop.
const peekTimeout = 5 * time.Second

// FuzzPeekClientHello: any bytes in front of a tunnel, never a panic and never a
// hang; what the peek read is exactly a prefix of the input (it is replayed to the
// upstream or the TLS terminator, so it must be the client's bytes, in order, and
// no more than maxClientHello). A ClientHello that crypto/tls's client wrote for a
// server name yields exactly the SNI that client put on the wire, with the fuzzed
// bytes after it left unread or replayed.
func FuzzPeekClientHello(f *testing.F) {
	for _, s := range []struct {
		sni  string
		alpn bool
	}{{"allowed.test", true}, {"api.allowed.test", false}, {"xn--bcher-kva.test", true}, {"a.b.c.d.e.f.g", false},
		{"127.0.0.1", false}, {"allowed.test.", true}, {"", true}, {strings.Repeat("a", 63) + ".test", false}} {
		hello := clientHelloFor(f, s.sni, s.alpn, false)
		f.Add(hello, s.sni, s.alpn)
		f.Add(hello[:len(hello)/2], s.sni, s.alpn)
		f.Add(append(append([]byte(nil), hello...), "GET / HTTP/1.1\r\n\r\n"...), s.sni, s.alpn)
	}
	f.Add([]byte("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), "", false)
	f.Add([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, "", false)
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00}, "", false)
	f.Add([]byte{0x80, 0x2e, 0x01, 0x00, 0x02}, "", false) // SSLv2-style
	f.Add([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70}, "", false)
	f.Fuzz(func(t *testing.T, data []byte, sni string, alpn bool) {
		checkPeek(t, data)
		hello := clientHelloFor(t, sni, alpn, true)
		if hello == nil {
			return // crypto/tls's client would not write a ClientHello for this name
		}
		got := checkPeek(t, append(hello, data...))
		if got == nil {
			t.Fatalf("a ClientHello from crypto/tls for %q was not read", sni)
		}
		if want := wireSNI(sni); got.serverName != want {
			t.Fatalf("SNI %q, want %q (client asked for %q)", got.serverName, want, sni)
		}
		if alpn && strings.Join(got.alpn, ",") != "h2,http/1.1" {
			t.Fatalf("ALPN %q, want h2,http/1.1", got.alpn)
		}
	})
}

// checkPeek peeks data and checks the invariants that hold for any input.
func checkPeek(t *testing.T, data []byte) *clientHello {
	t.Helper()
	type result struct {
		hello *clientHello
		err   error
	}
	done := make(chan result, 1)
	go func() {
		h, err := peekClientHello(bytes.NewReader(data))
		done <- result{h, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(peekTimeout):
		t.Fatalf("peekClientHello did not return within %v on %d bytes", peekTimeout, len(data))
	}
	if r.hello == nil {
		if r.err == nil {
			t.Fatal("peekClientHello returned neither a ClientHello nor an error")
		}
		return nil
	}
	if len(r.hello.raw) > maxClientHello || !bytes.HasPrefix(data, r.hello.raw) {
		t.Fatalf("peek read %d bytes that are not a prefix of the %d-byte input", len(r.hello.raw), len(data))
	}
	return r.hello
}

// wireSNI is the server_name crypto/tls's client sends for name: none for an IP
// literal, the name without its trailing dots otherwise (RFC 6066 §3).
func wireSNI(name string) string {
	host := name
	if len(host) > 0 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if i := strings.LastIndex(host, "%"); i > 0 {
		host = host[:i]
	}
	if net.ParseIP(host) != nil {
		return ""
	}
	return strings.TrimRight(name, ".")
}

// clientHelloFor returns the first flight crypto/tls's client writes for
// serverName, or nil when it refuses to write one. fast limits the key shares to
// X25519: the default post-quantum share costs more to generate than the peek
// costs to run, and the seeds cover it.
func clientHelloFor(tb testing.TB, serverName string, alpn, fast bool) []byte {
	tb.Helper()
	cfg := &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == "", MinVersion: tls.VersionTLS12}
	if fast {
		cfg.CurvePreferences = []tls.CurveID{tls.X25519}
	}
	if alpn {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	w := &captureConn{}
	if err := tls.Client(w, cfg).Handshake(); !errors.Is(err, errCaptured) {
		return nil
	}
	return w.buf.Bytes()
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
