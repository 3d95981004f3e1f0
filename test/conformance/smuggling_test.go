package conformance_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// smuggle is one request-smuggling attempt: a request head (and body) whose framing
// two HTTP parsers could read differently. {T} is the request target and {H} the
// host; smuggled requests name evil.test, which resolves to the forbidden upstream.
type smuggle struct {
	name, raw string
	detail    string // the bad_request detail; "" accepts any
}

var smuggles = []smuggle{
	{"CL.TE", "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
		"content_length_and_transfer_encoding"},
	{"TE.CL", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" +
		"3a\r\nGET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\nX: x\r\n\r\n0\r\n\r\n", "content_length_and_transfer_encoding"},
	{"TE.CL with the headers in lower case", "POST {T} HTTP/1.1\r\nHost: {H}\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n0\r\n\r\n",
		"content_length_and_transfer_encoding"},
	{"duplicate Content-Length, different", "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd" +
		"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", ""},
	{"Content-Length list, different", "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: 4, 40\r\n\r\nabcd", ""},
	{"signed Content-Length", "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: +4\r\n\r\nabcd", ""},
	{"obs-fold", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-A: 1\r\n folded\r\n\r\n", "obs_fold"},
	{"obs-fold of Transfer-Encoding", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", ""},
	{"obs-fold with a tab", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-A: 1\r\n\tTransfer-Encoding: chunked\r\n\r\n", "obs_fold"},
	{"Transfer-Encoding : chunked (space before colon)", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", "invalid_header_name"},
	{"Transfer-Encoding: xchunked", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", ""},
	{"Transfer-Encoding: chunked, identity", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", ""},
	{"Transfer-Encoding: identity", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: identity\r\nContent-Length: 4\r\n\r\nabcd", ""},
	{"two Transfer-Encoding headers", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ""},
	{"Transfer-Encoding with a control character", "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n", ""},
	{"Transfer-Encoding and Content-Length in HTTP/1.0", "POST {T} HTTP/1.0\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", ""},
	{"header name with a space", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX Forwarded: 1\r\n\r\n", ""},
	{"NUL in a header value", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-A: a\x00b\r\n\r\n", ""},
	{"bare CR in a header value", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-A: a\rTransfer-Encoding: chunked\r\n\r\n", ""},
}

// TestRequestSmuggling: a head with ambiguous framing is refused with 400
// bad_request before anything is forwarded, the connection is closed (what follows
// on it is never read as a request), and a legitimate request on a new connection
// still works. It runs on the explicit listener and inside an intercepted tunnel.
func TestRequestSmuggling(t *testing.T) {
	w := newWorld(t, config{})
	for _, where := range []string{"explicit", "intercepted"} {
		t.Run(where, func(t *testing.T) {
			for _, tc := range smuggles {
				t.Run(tc.name, func(t *testing.T) {
					k := w.begin(t)
					c, raw := k.smuggleConn(where, tc.raw)
					k.send(c, raw)
					method, _, _ := strings.Cut(raw, " ")
					k.refused(k.response(c, method), 400, "bad_request", tc.detail)
					k.assertClosed(c, 3*time.Second)
					k.assertUpstreamSaw(0)
					k.followUp(where)
				})
			}
		})
	}
}

// smuggleConn opens a connection for where (explicit: to the listener, for
// allowed.test; intercepted: a tunnel to api.allowed.test) and fills in raw.
func (k *kase) smuggleConn(where, raw string) (*conn, string) {
	if where == "explicit" {
		return k.dial(), strings.NewReplacer("{T}", "http://allowed.test/smuggle", "{H}", "allowed.test").Replace(raw)
	}
	return k.intercepted("api.allowed.test"), strings.NewReplacer("{T}", "/smuggle", "{H}", "api.allowed.test").Replace(raw)
}

// followUp sends a legitimate request on a new connection and expects it served;
// besides it the upstream may only have seen requests whose body broke off (the
// record of an aborted request can arrive late).
func (k *kase) followUp(where string) {
	k.t.Helper()
	n := len(k.upstreamSaw())
	if where == "explicit" {
		k.echo(k.get("http://allowed.test/after"))
	} else {
		k.assertInjected(k.echo(k.get("https://api.allowed.test/after")).Header)
	}
	after := 0
	for _, e := range k.upstreamSaw()[n:] {
		switch {
		case e.Path == "/after":
			after++
		case e.BodyErr == "":
			k.t.Errorf("after the refusal the upstream saw a complete request: %+v", e)
		}
	}
	if after != 1 {
		k.t.Errorf("the upstream saw /after %d times, want once", after)
	}
}

// TestRequestSmugglingBodies: framings egressd accepts are read once, the same
// way, by egressd and the upstream: a request hidden in a body stays body; a
// request pipelined after a body is decided on its own; a chunked body that breaks
// its framing never becomes a second request.
func TestRequestSmugglingBodies(t *testing.T) {
	w := newWorld(t, config{})
	hidden := "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	for _, where := range []string{"explicit", "intercepted"} {
		t.Run(where, func(t *testing.T) {
			t.Run("request hidden in a Content-Length body", func(t *testing.T) {
				k := w.begin(t)
				c, raw := k.smuggleConn(where, "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: "+itoa(len(hidden))+"\r\n\r\n"+hidden)
				k.send(c, raw)
				got := k.echo(k.response(c, http.MethodPost))
				if got.Body != hidden {
					t.Errorf("upstream body %q, want the hidden request as body", got.Body)
				}
				k.assertUpstreamSaw(1)
				k.assertNoEgressTo("evil.test")
			})
			t.Run("request hidden in a chunked body", func(t *testing.T) {
				k := w.begin(t)
				c, raw := k.smuggleConn(where, "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\n\r\n"+
					hexLen(len(hidden))+"\r\n"+hidden+"\r\n0\r\n\r\n")
				k.send(c, raw)
				got := k.echo(k.response(c, http.MethodPost))
				if got.Body != hidden {
					t.Errorf("upstream body %q, want the hidden request as body", got.Body)
				}
				k.assertUpstreamSaw(1)
				k.assertNoEgressTo("evil.test")
			})
			t.Run("duplicate Content-Length, equal, is one request", func(t *testing.T) {
				// RFC 9110 §8.6 lets a recipient take equal duplicates as one value; the
				// body is read once, and what follows is a request of its own.
				k := w.begin(t)
				c, raw := k.smuggleConn(where, "POST {T} HTTP/1.1\r\nHost: {H}\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd"+smuggledNext(where))
				k.send(c, raw)
				if got := k.echo(k.response(c, http.MethodPost)); got.Body != "abcd" {
					t.Errorf("upstream body %q, want abcd", got.Body)
				}
				k.assertNextRefused(c, where)
			})
			t.Run("request pipelined after a body is decided on its own", func(t *testing.T) {
				k := w.begin(t)
				c, raw := k.smuggleConn(where, "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"+smuggledNext(where))
				k.send(c, raw)
				if got := k.echo(k.response(c, http.MethodPost)); got.Body != "abcd" {
					t.Errorf("upstream body %q, want abcd", got.Body)
				}
				k.assertNextRefused(c, where)
			})
			t.Run("Transfer-Encoding in HTTP/1.0 is refused; what follows is never a request", func(t *testing.T) {
				// An HTTP/1.0 request with Transfer-Encoding has faulty framing (RFC 9112
				// §6.1): refused, the connection ends, and the chunked bytes after the
				// head are never read as a request.
				k := w.begin(t)
				c, raw := k.smuggleConn(where, "POST {T} HTTP/1.0\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\n\r\n"+
					hexLen(len(hidden))+"\r\n"+hidden+"\r\n0\r\n\r\n"+smuggledNext(where))
				k.send(c, raw)
				k.refused(k.response(c, http.MethodPost), 400, "bad_request", "http10_transfer_encoding")
				k.assertClosed(c, 3*time.Second)
				k.assertUpstreamSaw(0)
				k.assertNoEgressTo("evil.test")
			})
			for _, bad := range []struct{ name, body string }{
				{"chunked body with a bad chunk size", "zz\r\n" + hidden + "\r\n0\r\n\r\n"},
				{"chunked body with an overflowing chunk size", "fffffffffffffffffff\r\nabcd\r\n0\r\n\r\n"},
				{"chunked body shorter than its chunk size", "5\r\nabcd\r\n0\r\n\r\n" + smuggledNext(where)},
				{"chunked body with a negative chunk size", "-4\r\nabcd\r\n0\r\n\r\n"},
			} {
				t.Run(bad.name, func(t *testing.T) {
					k := w.begin(t)
					c, raw := k.smuggleConn(where, "POST {T} HTTP/1.1\r\nHost: {H}\r\nTransfer-Encoding: chunked\r\n\r\n"+bad.body)
					k.send(c, raw)
					resp := k.assertBadBodyRefused(c)
					k.assertNoEgressTo("evil.test")
					k.followUp(where)
					k.skipIfBadBodyBug(resp)
				})
			}
		})
	}
}

// smuggledNext is a second request to a host the connection may not reach.
func smuggledNext(where string) string {
	if where == "explicit" {
		return "GET http://evil.test/next HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	}
	return "GET /next HTTP/1.1\r\nHost: evil.test\r\n\r\n"
}

// assertNextRefused reads the response to smuggledNext: refused on its own merits.
func (k *kase) assertNextRefused(c *conn, where string) {
	k.t.Helper()
	if where == "explicit" {
		k.refused(k.response(c, http.MethodGet), 403, "not_allowlisted", "")
	} else {
		k.refused(k.response(c, http.MethodGet), 421, "host_mismatch", "host")
	}
	k.assertUpstreamSaw(1)
}

// assertBadBodyRefused expects a body whose chunked framing breaks to end in a
// refusal (a response that is not 2xx, or a closed connection) without the upstream
// reading a complete request, and returns the response, or nil when the connection
// closed without one.
func (k *kase) assertBadBodyRefused(c *conn) *http.Response {
	k.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodPost})
	if err != nil {
		return nil // closed without an answer: a clean refusal
	}
	k.body(resp)
	if resp.StatusCode < 300 {
		k.t.Errorf("a broken chunked body was answered %d", resp.StatusCode)
	}
	for _, e := range k.upstreamSaw() {
		if e.BodyErr == "" {
			k.t.Errorf("the upstream read a complete request from a broken body: %+v", e)
		}
	}
	return resp
}

// skipIfBadBodyBug checks the reason of the refusal of a broken request body. The
// body is the client's fault: 400 bad_request ("malformed request", docs/reasons.md).
func (k *kase) skipIfBadBodyBug(resp *http.Response) {
	k.t.Helper()
	if resp == nil {
		return
	}
	reason := resp.Header.Get("Egressd-Reason")
	if resp.StatusCode == http.StatusBadGateway && reason == "upstream_unreachable" {
		k.t.Error("a malformed chunked request body (the client's fault) is answered 502 upstream_unreachable " +
			"instead of 400 bad_request")
	}
	if resp.StatusCode != http.StatusBadRequest || reason != "bad_request" {
		k.t.Errorf("a broken chunked body got %d %q, want 400 bad_request", resp.StatusCode, reason)
	}
}

// assertNoEgressTo fails if egressd logged any request or tunnel for host.
func (k *kase) assertNoEgressTo(host string) {
	k.t.Helper()
	for _, l := range k.w.egressLines() {
		if l["host"] == host && l["decision"] == "allow" {
			k.t.Errorf("egressd allowed a request to %s: %v", host, l)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func hexLen(n int) string { return strconv.FormatInt(int64(n), 16) }
