package conformance_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestDenyInTunnel: with tls.deny_in_tunnel auto (the default), a refused CONNECT
// is answered 200 carrying Egressd-Reason; the client completes TLS with egressd's
// leaf for the requested name and its first request gets the refusal with its JSON
// body, then the connection closes. Sending ahead (a second request pipelined after
// the first) reaches nobody: the forbidden upstream and the canaries see nothing.
func TestDenyInTunnel(t *testing.T) {
	w := newWorld(t, config{denyInTunnel: "auto"})
	cases := []struct{ name, authority, reason, detail string }{
		{"not allowlisted", "evil.test:443", "not_allowlisted", ""},
		{"port not allowed", "ports.test:443", "port_not_allowed", ""},
		{"internal address literal", "169.254.169.254:443", "not_allowlisted", ""},
		{"lookalike", lookalikeASCII + ":443", "not_allowlisted", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			c := k.dial()
			k.send(c, "CONNECT "+tc.authority+" HTTP/1.1\r\nHost: "+tc.authority+"\r\n\r\n")
			resp := k.response(c, http.MethodConnect)
			if resp.StatusCode != 200 || resp.Header.Get("Egressd-Reason") != tc.reason {
				t.Fatalf("CONNECT: %d, Egressd-Reason %q; want 200 %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"), tc.reason)
			}
			host, _, _ := strings.Cut(tc.authority, ":")
			tc2, err := k.tlsOver(c, host, "http/1.1")
			if err != nil {
				t.Fatalf("TLS with egressd's leaf for %s: %v", host, err)
			}
			in := k.wrap(tc2)
			k.send(in, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\nGET /again HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			k.refused(k.response(in, "GET"), 403, tc.reason, tc.detail)
			k.assertClosed(in, ioTimeout)
			k.waitLog(func(l map[string]any) bool { return l["method"] == "CONNECT" && l["reason"] == tc.reason })
		})
	}
}
