package proxy_test

import (
	"bufio"
	"io"
	"net/http"
	"testing"
)

// TestConnectCarryingPlainHTTP: Node's undici tunnels http:// URLs through CONNECT
// host:80 too. A tunnel whose first bytes are not a ClientHello is served as plain
// HTTP against its target, each request decided as an http:// request: allowed
// ones reach the upstream, a credential entry gets plaintext_credential, and the
// inner Host may not name another host.
func TestConnectCarryingPlainHTTP(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	cases := []struct {
		name, authority, head string
		status                int
		reason                string
	}{
		{"allowed", "www.allowed.test:80", "GET /plain HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n", 200, ""},
		{"credential over plain HTTP", "api.allowed.test:80", "GET /plain HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", 403, "plaintext_credential"},
		{"another host inside", "www.allowed.test:80", "GET /plain HTTP/1.1\r\nHost: other.test\r\n\r\n", 421, "host_mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := w.Upstream.requests.Load()
			c := w.connect(t, tc.authority)
			br := bufio.NewReader(c)
			io.WriteString(c, tc.head)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.reason != "" {
				assertRefused(t, resp, tc.status, tc.reason, "")
				if w.Upstream.requests.Load() != before {
					t.Error("the upstream saw the refused request")
				}
				return
			}
			if got := decodeEcho(t, resp); got.Path != "/plain" || got.Host != "www.allowed.test" {
				t.Errorf("upstream got %s %s", got.Host, got.Path)
			}
			// keep-alive: a second request on the same tunnel
			io.WriteString(c, tc.head)
			if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
				t.Fatalf("second request: %v %v", resp, err)
			}
			resp.Body.Close()
		})
	}
	w.assertSecretNotLogged()
}
