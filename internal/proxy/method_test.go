package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
)

// reflectEntries: api.allowed.test injects over TLS, plain.allowed.test over plain
// HTTP (allow_plaintext), and everything else injects nothing.
var reflectEntries = []allowlist.Entry{
	{Domain: "api.allowed.test", Credential: "api"},
	{Domain: "plain.allowed.test", Credential: "api", AllowPlaintext: true},
	{Domain: "static.allowed.test", Transform: []allowlist.Header{{Name: "X-Static", Value: "static-" + secretToken}}, AllowPlaintext: true},
	{Domain: "*"},
}

// TestReflectingMethodsRefusedWhereInjected: TRACE (any case, and TRACK) and
// OPTIONS * to an entry that injects are answered 405 method_not_allowed and never
// reach the upstream, explicit over plain HTTP and inside intercepted tunnels, over
// HTTP/1.1 and HTTP/2. To an entry that injects nothing they pass.
func TestReflectingMethodsRefusedWhereInjected(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: reflectEntries})
	w.DNS.Set("plain.allowed.test", "A "+w.PublicIP)
	w.DNS.Set("static.allowed.test", "A "+w.PublicIP)
	refused := func(name string, resp *http.Response) {
		t.Helper()
		t.Run(name, func(t *testing.T) { assertRefused(t, resp, 405, "method_not_allowed", "") })
	}
	for _, head := range []string{
		"TRACE http://plain.allowed.test/ HTTP/1.1\r\nHost: plain.allowed.test\r\n\r\n",
		"trace http://plain.allowed.test/x HTTP/1.1\r\nHost: plain.allowed.test\r\n\r\n",
		"TRACK http://plain.allowed.test/ HTTP/1.1\r\nHost: plain.allowed.test\r\n\r\n",
		"TRACE http://static.allowed.test/ HTTP/1.1\r\nHost: static.allowed.test\r\n\r\n",
	} {
		refused("explicit "+head[:5], w.raw(head))
	}
	for _, head := range []string{
		"TRACE / HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n",
	} {
		tc, br := w.interceptedH1(t, "api.allowed.test")
		io.WriteString(tc, head)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		refused("tunnel h1 "+head[:7], resp)
	}
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	for _, method := range []string{"TRACE", "OPTIONS"} {
		req, _ := http.NewRequest(method, "https://api.allowed.test/", nil)
		if method == "OPTIONS" {
			req.URL.Path, req.URL.Opaque = "", "*"
		}
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		refused("tunnel h2 "+method, resp)
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d request(s)", n)
	}
	w.assertNoCanaryHit()
	line := w.lastLog("")
	if line["reason"] != "method_not_allowed" || line["decision"] != "deny" || line["status"] != float64(405) {
		t.Errorf("log line: %v", line)
	}
	w.assertSecretNotLogged()

	// Where nothing is injected, TRACE is the upstream's business.
	resp := w.raw("TRACE http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if got := decodeEcho(t, resp); got.Method != "TRACE" {
		t.Errorf("TRACE to a non-injecting entry: upstream saw %q", got.Method)
	}
}

// TestReflectingMethodsRefusedWithPlaceholders: a TRACE into which egressd would
// replace a placeholder (to a trusted domain whose entry injects nothing) is
// refused too, and the upstream sees nothing.
func TestReflectingMethodsRefusedWithPlaceholders(t *testing.T) {
	w := newPlaceholderWorld(t)
	tc, br := w.interceptedH1(t, "api.allowed.test")
	io.WriteString(tc, "TRACE / HTTP/1.1\r\nHost: api.allowed.test\r\nX-Api-Key: "+w.ph("EV_KEY")+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertRefused(t, resp, 405, "method_not_allowed", "")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d request(s)", n)
	}
}
