package clients_test

import (
	"strings"
	"testing"
)

// The curl cases: HTTP/1.1 and HTTP/2 (ALPN) on https, plain http, the h2c offer
// of --http2 on http://, and two refusals, with the proxy (https_proxy,
// http_proxy) and CA bundle (CURL_CA_BUNDLE) from the environment.

// curlOut is what curl printed: the body, then the -w line.
type curlOut struct {
	body, code, version, reason string
	output
}

// curl runs curl with args and the proxy and CA of the environment.
func curl(t *testing.T, w *world, args ...string) curlOut {
	t.Helper()
	o := w.run(t, nil, "curl", append([]string{"-sS", "--max-time", "20",
		"-w", "\n%{http_code} %{http_version} %header{egressd-reason}"}, args...)...)
	body, last, _ := cutLast(o.stdout, "\n")
	f := append(strings.Fields(last), "", "", "")
	return curlOut{body: body, code: f[0], version: f[1], reason: f[2], output: o}
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", s, false
	}
	return s[:i], s[i+len(sep):], true
}

// curlServed runs curl on url (path under host) and checks what it printed and
// what the stand-in saw.
func curlServed(version string, url func(path string) string, want expect, args ...string) func(*testing.T, *world, string) {
	return func(t *testing.T, w *world, path string) {
		u := url(path)
		c := curl(t, w, append(args, u)...)
		if c.code != "200" || c.version != version {
			t.Fatalf("curl printed status %s over HTTP/%s, want 200 over HTTP/%s\n%s", c.code, c.version, version, c.output)
		}
		w.assertServed(t, path, c.body, want)
	}
}

func httpsURL(host string) func(string) string {
	return func(p string) string { return "https://" + host + p }
}
func httpURL(host string) func(string) string {
	return func(p string) string { return "http://" + host + p }
}

var curlCases = []clientCase{
	{client: "curl", name: "h1 https spliced", tool: "curl",
		run: curlServed("1.1", httpsURL(githubHost), expect{host: githubHost, proto: "HTTP/1.1", tls: true}, "--http1.1")},
	{client: "curl", name: "h2 https spliced", tool: "curl",
		run: curlServed("2", httpsURL(githubHost), expect{host: githubHost, proto: "HTTP/2.0", tls: true}, "--http2")},
	{client: "curl", name: "h2 https injected", tool: "curl",
		run: curlServed("2", httpsURL(openaiHost), expect{host: openaiHost, tls: true, auth: "Bearer <OPENAI>"}, "--http2")},
	{client: "curl", name: "h1 http", tool: "curl",
		run: curlServed("1.1", httpURL(plainHost), expect{host: plainHost, proto: "HTTP/1.1"})},
	{client: "curl", name: "--http2 http:// (h2c offer declined)", tool: "curl", run: curlH2C},
	{client: "curl", name: "refused https not_allowlisted", tool: "curl", run: curlRefused(httpsURL(evilHost), "not_allowlisted")},
	{client: "curl", name: "refused http plaintext_credential", tool: "curl", run: curlRefused(httpURL(openaiHost), "plaintext_credential")},
}

// curlH2C: curl --http2 on an http:// URL offers Upgrade: h2c with HTTP2-Settings;
// egressd declines it as a server that ignores the offer would, and the request is
// served over HTTP/1.1 without either header reaching the upstream.
func curlH2C(t *testing.T, w *world, path string) {
	curlServed("1.1", httpURL(plainHost), expect{host: plainHost, proto: "HTTP/1.1"}, "--http2")(t, w, path)
	got, _ := w.up.saw(path)
	if got.Header.Get("Upgrade") != "" || got.Header.Get("Http2-Settings") != "" ||
		strings.Contains(strings.ToLower(got.Header.Get("Connection")), "upgrade") {
		t.Errorf("the h2c offer reached the stand-in: %v", got.Header)
	}
}

func curlRefused(url func(string) string, reason string) func(*testing.T, *world, string) {
	return func(t *testing.T, w *world, path string) {
		c := curl(t, w, url(path))
		t.Logf("curl printed: %s", c.output)
		if c.code != "403" || c.reason != reason {
			t.Fatalf("curl printed status %q, Egressd-Reason %q; want 403 %s%s\n%s", c.code, c.reason, reason,
				sinkholeNote(w.mode, c.stderr), c.output)
		}
		assertRefusal(t, c.body, reason)
		w.assertNotServed(t, path)
	}
}
