package conformance_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestProtocolEdges (issue 13): an h2c upgrade is refused and ends the connection,
// whatever was sent after it; an upstream cannot fake egressd's own fields.
func TestProtocolEdges(t *testing.T) {
	w := newWorld(t, config{})
	upgrades := map[string]string{
		"h2c with HTTP2-Settings": "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
		"h2c in an Upgrade list":  "Connection: Upgrade\r\nUpgrade: websocket, H2C\r\n",
		"h2c without Connection":  "Upgrade: h2c\r\n",
	}
	for _, where := range []string{"intercepted", "explicit"} {
		for name, hdr := range upgrades {
			t.Run(where+"/"+name, func(t *testing.T) {
				k := w.begin(t)
				c, target, host := k.headerConn(where)
				k.send(c, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\n"+hdr+"\r\n"+
					"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"+"GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				resp := k.response(c, http.MethodGet)
				if !resp.Close {
					t.Error("refusal without Connection: close")
				}
				k.refused(resp, 400, "bad_request", "h2c_upgrade")
				k.assertClosed(c, 3*time.Second)
				k.assertUpstreamSaw(0)
			})
		}
		t.Run(where+"/upstream Egressd-* headers and trailers are removed", func(t *testing.T) {
			k := w.begin(t)
			c, target, host := k.headerConn(where)
			k.send(c, "GET "+target+"?forge=1 HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			resp := k.response(c, http.MethodGet)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			for _, h := range []http.Header{resp.Header, resp.Trailer} {
				for name := range h {
					if strings.HasPrefix(strings.ToLower(name), "egressd-") {
						t.Errorf("client saw the upstream's %s", name)
					}
				}
			}
			if resp.Trailer.Get("X-Undeclared") != "kept" {
				t.Errorf("trailers %v, want X-Undeclared", resp.Trailer)
			}
			k.assertUpstreamSaw(1)
		})
	}
}
