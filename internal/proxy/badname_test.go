package proxy_test

import (
	"net"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/badnames"
)

// TestBadNamesRefusedBeforeDNS: a host that is not a DNS name is refused with
// 400 bad_request, detail bad_name, as an absolute-form GET and as a CONNECT,
// before any DNS query: the stub sees none, and neither the upstream nor any
// canary sees a connection. "_" is a hostname character egressd accepts, so
// "_dmarc.allowed.test" is looked up (which shows the query count works).
func TestBadNamesRefusedBeforeDNS(t *testing.T) {
	w := newWorld(t, worldOpts{})
	for _, tc := range badnames.Under("allowed.test") {
		t.Run(tc.Name, func(t *testing.T) {
			resp := w.raw("GET http://" + tc.Host + "/ HTTP/1.1\r\nHost: " + tc.Host + "\r\n\r\n")
			assertRefused(t, resp, 400, "bad_request", "bad_name")
			authority := net.JoinHostPort(tc.Host, "443")
			resp = w.raw("CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n")
			assertRefused(t, resp, 400, "bad_request", "bad_name")
		})
	}
	if n := w.DNS.Total(); n != 0 {
		t.Errorf("the DNS stub saw %d queries for names that are not DNS names, want 0", n)
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want 0", n)
	}
	w.assertNoCanaryHit()

	w.DNS.Set("_dmarc.allowed.test", "A "+w.PublicIP)
	resp := w.raw("GET http://_dmarc.allowed.test/ HTTP/1.1\r\nHost: _dmarc.allowed.test\r\n\r\n")
	resp.Body.Close()
	if resp.StatusCode != 200 || w.DNS.Queries("_dmarc.allowed.test") == 0 {
		t.Errorf("_dmarc.allowed.test: status %d, %d queries; want 200 after a lookup", resp.StatusCode, w.DNS.Queries("_dmarc.allowed.test"))
	}
}

// TestTransparentBadNamesRefusedBeforeDNS: on the transparent listener, a plain HTTP
// Host and a TLS SNI that are not DNS names are refused (400 bad_name; a TLS alert
// logged as bad_request, detail bad_name) before any DNS query.
func TestTransparentBadNamesRefusedBeforeDNS(t *testing.T) {
	w, sb := newTransparentWorld(t)
	before := w.DNS.Total()
	for _, host := range []string{"-a.allowed.test", "a-.allowed.test", "a..allowed.test"} {
		c, err := sb.dial(t, "tcp", w.PublicIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		assertRefused(t, get(t, c, host, "/"), 400, "bad_request", "bad_name")
		c.Close()
	}
	for _, sni := range []string{"-a.allowed.test", "a-.allowed.test"} {
		if _, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", sni); err == nil {
			t.Errorf("TLS with SNI %q: handshake succeeded, want an alert", sni)
		}
	}
	// One line per refusal: three plain HTTP requests and two handshakes.
	for deadline := time.Now().Add(3 * time.Second); badNameLines(w) < 5 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := badNameLines(w); n != 5 {
		t.Errorf("%d transparent log lines with bad_request/bad_name, want 5:\n%s", n, w.logs.Bytes())
	}
	if n := w.DNS.Total() - before; n != 0 {
		t.Errorf("the DNS stub saw %d queries, want 0", n)
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want 0", n)
	}
	w.assertNoCanaryHit()
}

func badNameLines(w *world) int {
	n := 0
	for _, l := range w.logLines() {
		if l["listener"] == "transparent" && l["reason"] == "bad_request" && l["detail"] == "bad_name" {
			n++
		}
	}
	return n
}
