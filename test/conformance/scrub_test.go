package conformance_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestNothingInjectedComesBack: against the real binary, an upstream that reflects
// the injected credential (in the body, a cookie, base64 in a header, gzipped or
// not) is scrubbed before the client reads it, explicit (egressd originates TLS)
// and inside an intercepted tunnel; the case's own checks grep every byte the
// client read and egressd's output for the secret. TRACE and OPTIONS * to the
// credential host are refused and never forwarded.
func TestNothingInjectedComesBack(t *testing.T) {
	w := newWorld(t, config{})
	masked := "you sent: " + strings.Repeat("*", len("Bearer "+secret)) + "\n"
	for _, target := range []string{"/reflect", "/reflect?gzip=1"} {
		t.Run("absolute-form "+target, func(t *testing.T) {
			k := w.begin(t)
			resp := k.raw("GET https://api.allowed.test" + target + " HTTP/1.1\r\nHost: api.allowed.test\r\nAccept-Encoding: gzip\r\n\r\n")
			if body := string(k.body(resp)); body != masked || resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("body %q (Content-Encoding %q), want %q", body, resp.Header.Get("Content-Encoding"), masked)
			}
		})
		t.Run("tunnel "+target, func(t *testing.T) {
			k := w.begin(t)
			c := k.intercepted("api.allowed.test")
			k.send(c, "GET "+target+" HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
			if body := string(k.body(k.response(c, http.MethodGet))); body != masked {
				t.Errorf("body %q, want %q", body, masked)
			}
		})
	}
	for _, head := range []string{"TRACE / HTTP/1.1", "OPTIONS * HTTP/1.1"} {
		t.Run(head, func(t *testing.T) {
			k := w.begin(t)
			c := k.intercepted("api.allowed.test")
			method, _, _ := strings.Cut(head, " ")
			k.send(c, head+"\r\nHost: api.allowed.test\r\n\r\n")
			k.refused(k.response(c, method), 405, "method_not_allowed", "")
			k.assertUpstreamSaw(0)
		})
	}
}
