package conformance_test

import (
	"net/http"
	"testing"
	"time"
)

// TestConnectAndAbsoluteFormEdges: request targets that are malformed, ambiguous
// or dressed up are refused with bad_request, or decided on the host they really
// name; an allowlisted name stays allowed however it is spelt and a lookalike stays
// out.
func TestConnectAndAbsoluteFormEdges(t *testing.T) {
	w := newWorld(t, config{})
	refusals := []struct {
		name, raw      string
		status         int
		reason, detail string
	}{
		{"CONNECT to a path", "CONNECT /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT without port", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with empty port", "CONNECT allowed.test: HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with port 0", "CONNECT allowed.test:0 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with port 65536", "CONNECT allowed.test:65536 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with signed port", "CONNECT allowed.test:+443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", ""},
		{"CONNECT with userinfo", "CONNECT user@allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with userinfo naming an allowed host", "CONNECT allowed.test:443@evil.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT with a percent-encoded host", "CONNECT %61llowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 400, "bad_request", ""},
		{"CONNECT with an encoded dot", "CONNECT allowed.test%2eevil.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 400, "bad_request", ""},
		{"CONNECT with an absolute URL", "CONNECT http://allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 400, "bad_request", "connect_target"},
		{"CONNECT to an allowlisted name's IP literal", "CONNECT " + publicIP + ":443 HTTP/1.1\r\nHost: " + publicIP + ":443\r\n\r\n", 403, "not_allowlisted", ""},
		{"CONNECT to the metadata IP literal", "CONNECT 169.254.169.254:443 HTTP/1.1\r\nHost: 169.254.169.254:443\r\n\r\n", 403, "not_allowlisted", ""},
		{"CONNECT to an IPv6 loopback literal", "CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n", 403, "not_allowlisted", ""},
		{"CONNECT to a non-allowlisted name", "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n", 403, "not_allowlisted", ""},
		{"CONNECT to a port the entry does not allow", "CONNECT ports.test:443 HTTP/1.1\r\nHost: ports.test:443\r\n\r\n", 403, "port_not_allowed", ""},
		{"CONNECT in uppercase to a non-allowlisted name", "CONNECT EVIL.TEST:443 HTTP/1.1\r\nHost: EVIL.TEST:443\r\n\r\n", 403, "not_allowlisted", ""},
		{"origin-form request", "GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "not_proxy_request"},
		{"asterisk-form request", "OPTIONS * HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "not_proxy_request"},
		{"userinfo in absolute-form", "GET http://a@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "userinfo"},
		{"userinfo naming the allowed host", "GET http://allowed.test@evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "userinfo"},
		{"userinfo with password", "GET http://allowed.test:443@evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "userinfo"},
		{"percent-encoded host in absolute-form", "GET http://%61llowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", ""},
		{"encoded @ in the host", "GET http://allowed.test%40evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", ""},
		{"backslash in the authority", "GET http://evil.test\\@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", ""},
		{"port 0 in absolute-form", "GET http://allowed.test:0/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "host"},
		{"unsupported scheme", "GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", "scheme"},
		{"uppercase scheme and host of a non-allowlisted name", "GET HTTP://EVIL.TEST/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"https absolute-form to a non-allowlisted name", "GET https://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"plain http to a credential host in uppercase", "GET HTTP://API.ALLOWED.TEST/ HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", 403, "plaintext_credential", ""},
		{"IDN: ASCII lookalike of the allowlisted IDN", "GET http://bucher.test/ HTTP/1.1\r\nHost: bucher.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"IDN: Unicode lookalike of an allowlisted name", "GET http://" + lookalikeUnicode + "/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"IDN: punycode lookalike of an allowlisted name", "GET http://" + lookalikeASCII + "/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"IDN: CONNECT to the Unicode lookalike", "CONNECT " + lookalikeUnicode + ":443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n", 403, "not_allowlisted", ""},
		{"suffix of an allowlisted name", "GET http://allowed.test.evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, "not_allowlisted", ""},
		{"fragment before the userinfo", "GET http://evil.test#@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, "bad_request", ""},
		{"plain http to the credential host's TLS port", "GET http://api.allowed.test:443/ HTTP/1.1\r\nHost: api.allowed.test:443\r\n\r\n", 403, "plaintext_credential", ""},
		{"allowlisted name without a label boundary", "GET http://allowed.testevil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, "not_allowlisted", ""},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			k.refused(k.raw(tc.raw), tc.status, tc.reason, tc.detail)
			k.assertUpstreamSaw(0)
		})
	}

	allowed := []struct{ name, raw, wantHost string }{
		{"uppercase scheme and host", "GET HTTP://ALLOWED.TEST/up HTTP/1.1\r\nHost: ALLOWED.TEST\r\n\r\n", "allowed.test"},
		{"trailing dot", "GET http://allowed.test./dot HTTP/1.1\r\nHost: allowed.test.\r\n\r\n", "allowed.test"},
		{"explicit default port", "GET http://allowed.test:80/port HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test"},
		{"Host header naming another host than the URL", "GET http://allowed.test/host HTTP/1.1\r\nHost: evil.test\r\n\r\n", "allowed.test"},
		{"IDN: Unicode spelling of the allowlisted IDN", "GET http://bücher.test/idn HTTP/1.1\r\nHost: bücher.test\r\n\r\n", "xn--bcher-kva.test"},
		{"IDN: punycode of the allowlisted IDN", "GET http://xn--bcher-kva.test/idn HTTP/1.1\r\nHost: xn--bcher-kva.test\r\n\r\n", "xn--bcher-kva.test"},
		{"IDN: uppercase punycode", "GET http://XN--BCHER-KVA.TEST/idn HTTP/1.1\r\nHost: xn--bcher-kva.test\r\n\r\n", "xn--bcher-kva.test"},
		{"absolute-form with https scheme", "GET https://allowed.test/tls HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "allowed.test"},
	}
	for _, tc := range allowed {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			got := k.echo(k.raw(tc.raw))
			if got.Host != tc.wantHost {
				t.Errorf("upstream saw Host %q, want %q", got.Host, tc.wantHost)
			}
			k.assertUpstreamSaw(1)
		})
	}

	t.Run("absolute-form https to a credential host gets the credential", func(t *testing.T) {
		k := w.begin(t)
		got := k.echo(k.raw("GET https://api.allowed.test/abs HTTP/1.1\r\nHost: api.allowed.test\r\nAuthorization: Bearer client\r\n\r\n"))
		k.assertInjected(got.Header)
		if got.Proto != "HTTP/2.0" && got.Proto != "HTTP/1.1" {
			t.Errorf("upstream proto %q", got.Proto)
		}
	})
	tunnels := []struct{ name, authority, sni string }{
		{"CONNECT in uppercase", "ALLOWED.TEST:443", "allowed.test"},
		{"CONNECT with a trailing dot", "allowed.test.:443", "allowed.test"},
		{"IDN: CONNECT in Unicode, SNI in punycode", "bücher.test:443", "xn--bcher-kva.test"},
		{"IDN: CONNECT in punycode", "xn--bcher-kva.test:443", "xn--bcher-kva.test"},
	}
	for _, tc := range tunnels {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			tc2, err := k.tlsOver(k.connect(tc.authority), tc.sni, "http/1.1")
			if err != nil {
				t.Fatalf("TLS through the tunnel: %v", err)
			}
			c := k.wrap(tc2)
			k.send(c, "GET /tunnel HTTP/1.1\r\nHost: "+tc.sni+"\r\n\r\n")
			if got := k.echo(k.response(c, http.MethodGet)); got.Host != tc.sni {
				t.Errorf("upstream saw Host %q", got.Host)
			}
		})
	}
	t.Run("IDN: CONNECT to the punycode lookalike", func(t *testing.T) {
		k := w.begin(t)
		resp := k.raw("CONNECT " + lookalikeASCII + ":443 HTTP/1.1\r\nHost: " + lookalikeASCII + ":443\r\n\r\n")
		rb := k.refused(resp, 403, "not_allowlisted", "")
		if rb.Host != lookalikeASCII {
			t.Errorf("refusal names host %q, want %q", rb.Host, lookalikeASCII)
		}
	})
	t.Run("refused CONNECT closes the connection", func(t *testing.T) {
		// Bytes a client sent ahead after a refused CONNECT (a pipelined request, an
		// optimistic ClientHello) are never parsed as a request.
		for _, ahead := range []string{"GET http://allowed.test/next HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "\x16\x03\x01\x00\x05hello"} {
			k := w.begin(t)
			c := k.dial()
			k.send(c, "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"+ahead)
			resp := k.response(c, http.MethodConnect)
			if !resp.Close {
				t.Error("refusal without Connection: close")
			}
			k.refused(resp, 403, "not_allowlisted", "")
			k.assertClosed(c, 3*time.Second)
			k.assertUpstreamSaw(0)
		}
	})
}
