package conformance_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestHeaderAbuse: nothing the sandbox sends can strip, duplicate, override or
// read what egressd injects; hop-by-hop, Proxy-Authorization and Egressd-* fields
// never reach the upstream. Each case runs inside an intercepted HTTP/1.1 tunnel to
// api.allowed.test and on the explicit listener to plain.allowed.test (the same
// entry over plain http, so the raw head is the client's own).
func TestHeaderAbuse(t *testing.T) {
	w := newWorld(t, config{})
	cases := []struct {
		name, headers, body string
		absent              []string // fields the upstream must not receive
		present             map[string]string
		trailer             map[string]string // exactly the trailer the upstream must receive
	}{
		{name: "Connection: Authorization does not strip the injected credential",
			headers: "Connection: Authorization\r\nAuthorization: Bearer client\r\n"},
		{name: "Connection: X-Injected does not strip the injected transform",
			headers: "Connection: X-Injected\r\nX-Injected: client\r\n"},
		{name: "Connection naming both injected headers, in other cases",
			headers: "Connection: keep-alive, authorization, X-INJECTED\r\nauthorization: Bearer client\r\n"},
		{name: "Connection split over two fields",
			headers: "Connection: X-Injected\r\nConnection: Authorization\r\n"},
		{name: "hop-by-hop fields are stripped, injected ones are not",
			headers: "Connection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: gzip;q=0.5, trailers\r\n" +
				"Proxy-Connection: keep-alive\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-Keep: kept\r\n",
			absent: []string{"X-Hop", "Keep-Alive", "Proxy-Connection", "Connection", "Http2-Settings"},
			// TE is hop-by-hop; only its "trailers" travels on (the one TE HTTP/2
			// allows, which gRPC servers may require).
			present: map[string]string{"X-Keep": "kept", "Te": "trailers"}},
		{name: "egressd adds no header of its own (no User-Agent, no Accept-Encoding)",
			headers: "X-Keep: kept\r\n",
			absent:  []string{"User-Agent", "Accept-Encoding"},
			present: map[string]string{"X-Keep": "kept"}},
		{name: "client copies of the injected headers in every case",
			headers: "Authorization: Bearer one\r\nauthorization: Bearer two\r\nAUTHORIZATION: Bearer three\r\n" +
				"x-injected: a\r\nX-INJECTED: b\r\nX-Injected: c\r\n"},
		{name: "injected header names in a chunked request trailer",
			headers: "Transfer-Encoding: chunked\r\nTrailer: Authorization, X-Injected, X-Checksum\r\n",
			body:    "7\r\npayload\r\n0\r\nAuthorization: Bearer smuggled\r\nx-injected: smuggled\r\nX-Checksum: c0ffee\r\n\r\n",
			trailer: map[string]string{"X-Checksum": "c0ffee"}},
		{name: "Egressd-* and hop-by-hop names in a chunked request trailer",
			headers: "Transfer-Encoding: chunked\r\nTrailer: Egressd-Hook-Assertion, Connection, X-Checksum\r\n",
			body:    "7\r\npayload\r\n0\r\nEgressd-Hook-Assertion: forged\r\nConnection: Authorization\r\nX-Checksum: c0ffee\r\n\r\n",
			trailer: map[string]string{"X-Checksum": "c0ffee"}},
		{name: "Egressd-* headers from the client are stripped",
			headers: "Egressd-Hook-Assertion: forged\r\negressd-reason: forged\r\nEGRESSD-REQUEST-ID: forged\r\n",
			absent:  []string{"Egressd-Hook-Assertion", "Egressd-Reason", "Egressd-Request-Id"}},
		{name: "Proxy-Authorization is never forwarded",
			headers: "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Authenticate: Basic\r\n",
			absent:  []string{"Proxy-Authorization", "Proxy-Authenticate"}},
		{name: "WebSocket upgrade whose Connection names the injected headers",
			headers: "Connection: Upgrade, Authorization, X-Injected\r\nUpgrade: websocket\r\nAuthorization: Bearer client\r\n",
			present: map[string]string{"Upgrade": "websocket"}},
	}
	for _, where := range []string{"intercepted", "explicit"} {
		t.Run(where, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					k := w.begin(t)
					c, target, host := k.headerConn(where)
					method := "GET"
					if tc.body != "" {
						method = "POST"
					}
					k.send(c, method+" "+target+" HTTP/1.1\r\nHost: "+host+"\r\n"+tc.headers+"\r\n"+tc.body)
					resp := k.response(c, method)
					if resp.StatusCode == http.StatusSwitchingProtocols {
						t.Fatal("the upstream was asked to switch protocols")
					}
					got := k.echo(resp)
					k.assertInjected(got.Header)
					for _, h := range tc.absent {
						if v, ok := got.Header[http.CanonicalHeaderKey(h)]; ok {
							t.Errorf("upstream received %s: %q", h, v)
						}
					}
					for h, v := range tc.present {
						if g := got.Header.Values(h); len(g) != 1 || g[0] != v {
							t.Errorf("upstream %s = %q, want %q", h, g, v)
						}
					}
					if tc.trailer != nil {
						want := http.Header{}
						for h, v := range tc.trailer {
							want.Set(h, v)
						}
						if !sameHeader(got.Trailer, want) {
							t.Errorf("upstream trailer %v, want %v", got.Trailer, want)
						}
					}
					k.assertUpstreamSaw(1)
				})
			}
		})
	}
	dupHost := []struct{ name, where, raw string }{
		{"duplicate Host headers, explicit", "explicit", "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n"},
		{"duplicate Host headers, intercepted", "intercepted", "GET / HTTP/1.1\r\nHost: api.allowed.test\r\nHost: evil.test\r\n\r\n"},
		{"duplicate Host headers, the same, intercepted", "intercepted", "GET / HTTP/1.1\r\nHost: api.allowed.test\r\nHost: api.allowed.test\r\n\r\n"},
		{"empty Host header, intercepted", "intercepted", "GET / HTTP/1.1\r\nHost:\r\n\r\n"},
	}
	for _, tc := range dupHost {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			c := k.dial()
			if tc.where == "intercepted" {
				c = k.intercepted("api.allowed.test")
			}
			k.send(c, tc.raw)
			k.refused(k.response(c, http.MethodGet), 400, "bad_request", "")
			k.assertUpstreamSaw(0)
		})
	}
	t.Run("injected header names in an HTTP/2 request trailer", func(t *testing.T) {
		k := w.begin(t)
		pr, pw := io.Pipe()
		req, _ := http.NewRequest(http.MethodPost, "https://api.allowed.test/h2-trailer", pr)
		req.Header.Set("X-Injected", "client")
		req.Trailer = http.Header{"X-Injected": nil, "X-Checksum": nil}
		go func() {
			io.WriteString(pw, "payload")
			req.Trailer.Set("X-Injected", "smuggled")
			req.Trailer.Set("X-Checksum", "c0ffee")
			pw.Close()
		}()
		resp, err := k.h2("api.allowed.test:443").RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got := k.echo(resp)
		k.assertInjected(got.Header)
		if v := got.Trailer.Values("X-Injected"); len(v) != 0 {
			t.Errorf("upstream trailer X-Injected = %q", v)
		}
		if got.Trailer.Get("X-Checksum") != "c0ffee" {
			t.Errorf("upstream trailer %v lacks X-Checksum", got.Trailer)
		}
	})
	t.Run("client headers over HTTP/2 in other cases", func(t *testing.T) {
		k := w.begin(t)
		req, _ := http.NewRequest(http.MethodGet, "https://api.allowed.test/h2-case", nil)
		req.Header["authorization"] = []string{"Bearer lower"}
		req.Header["Authorization"] = []string{"Bearer canonical"}
		req.Header["x-injected"] = []string{"lower"}
		req.Header["Egressd-Hook-Assertion"] = []string{"forged"}
		resp, err := k.h2("api.allowed.test:443").RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got := k.echo(resp)
		k.assertInjected(got.Header)
		if got.Header.Get("Egressd-Hook-Assertion") != "" {
			t.Error("upstream received Egressd-Hook-Assertion")
		}
	})
	t.Run("a non-injecting entry forwards no credential", func(t *testing.T) {
		k := w.begin(t)
		for _, u := range []string{"http://allowed.test/", "https://www.allowed.test/"} {
			got := k.echo(k.get(u))
			if v := got.Header.Values("Authorization"); len(v) != 0 {
				t.Errorf("%s: upstream received Authorization %q", u, v)
			}
			if v := got.Header.Values("X-Injected"); len(v) != 0 {
				t.Errorf("%s: upstream received X-Injected %q", u, v)
			}
		}
	})
}

// headerConn opens the connection a header case runs on and returns the request
// target and Host to use on it.
func (k *kase) headerConn(where string) (*conn, string, string) {
	if where == "intercepted" {
		return k.intercepted("api.allowed.test"), "/headers", "api.allowed.test"
	}
	return k.dial(), "http://plain.allowed.test/headers", "plain.allowed.test"
}

// sameHeader compares two headers by canonical name and values.
func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\x00") != strings.Join(b.Values(k), "\x00") {
			return false
		}
	}
	return true
}
