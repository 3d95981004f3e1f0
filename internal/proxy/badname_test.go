package proxy_test

import (
	"net"
	"testing"

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
