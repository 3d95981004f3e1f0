package proxy_test

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/scrub"
)

// formsToken is the credential of forms.allowed.test: its characters differ in
// every encoding the scrubber knows (base64's + and /, percent, JSON's \u0026,
// \u003c and \u003e, hex).
const formsToken = "sk+Ref&lect<ed>/value=9z"

// scrubEntries: api.allowed.test and forms.allowed.test inject a credential (and
// api a transform); plain.allowed.test injects over plain HTTP; everything else
// injects nothing.
var scrubEntries = []allowlist.Entry{
	{Domain: "api.allowed.test", Credential: "api", Transform: []allowlist.Header{{Name: "X-Static", Value: staticValue + "-0123"}}},
	{Domain: "forms.allowed.test", Credential: "forms"},
	{Domain: "plain.allowed.test", Credential: "api", AllowPlaintext: true},
	{Domain: "*"},
}

func newScrubWorld(t *testing.T) *world {
	t.Helper()
	forms, _ := json.Marshal(formsToken)
	w := newInjectWorld(t, worldOpts{allowlist: scrubEntries, credentials: map[string]string{
		"api": `{"token": "` + secretToken + `"}`, "forms": `{"token": ` + string(forms) + `}`,
	}})
	for _, h := range []string{"forms.allowed.test", "plain.allowed.test"} {
		w.DNS.Set(h, "A "+w.PublicIP)
	}
	w.Upstream.set(reflector)
	return w
}

// injected is the credential the upstream received: the header value and the
// token after its scheme.
func injected(r *http.Request) (value, token string) {
	value = r.Header.Get("Authorization")
	return value, strings.TrimPrefix(value, "Bearer ")
}

// encodings are the forms an upstream reflects a value in.
var encodings = map[string]func(string) string{
	"raw":       func(s string) string { return s },
	"base64":    func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"base64url": func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) },
	"percent":   url.QueryEscape,
	"json": func(s string) string {
		b, _ := json.Marshal(s)
		return string(b[1 : len(b)-1])
	},
	"hex": func(s string) string { return hex.EncodeToString([]byte(s)) },
}

// leakForms is every form of every injected value a test looks for in what the
// client received and in the log.
func leakForms() []string {
	var out []string
	for _, v := range []string{secretToken, "Bearer " + secretToken, formsToken, "Bearer " + formsToken} {
		for _, enc := range encodings {
			out = append(out, enc(v))
		}
	}
	return out
}

// assertNoLeak fails if b holds any form of an injected value.
func assertNoLeak(t *testing.T, where string, b []byte) {
	t.Helper()
	for _, f := range leakForms() {
		if bytes.Contains(b, []byte(f)) {
			t.Errorf("%s: the client received an injected value (form %q)", where, f)
		}
	}
}

func stars(n int) string { return strings.Repeat("*", n) }

// reflector is the upstream: it sends back the credential it received, in the
// place and form the path and query name.
func reflector(rw http.ResponseWriter, r *http.Request) {
	value, token := injected(r)
	q := r.URL.Query()
	switch r.URL.Path {
	case "/header":
		h := rw.Header()
		h.Set("Location", "https://cb.test/?code="+url.QueryEscape(token))
		h.Set("Set-Cookie", "sess="+base64.StdEncoding.EncodeToString([]byte(value))+"; Path=/")
		h.Set("Www-Authenticate", `Bearer realm="api", error="invalid_token", token="`+token+`"`)
		h["X-Echo-"+token] = []string{"1"}
		rw.WriteHeader(http.StatusFound)
	case "/trailer":
		rw.Header().Set("Trailer", "X-Echo-Trailer, X-Named-"+token)
		io.WriteString(rw, "body")
		rw.Header().Set("X-Echo-Trailer", value)
		rw.Header().Set("X-Named-"+token, "1")
	case "/body":
		writeSplit(rw, "[["+encodings[q.Get("form")](token)+"]]", q.Get("split"), q.Has("cl"))
	case "/compressed":
		writeCompressed(rw, q.Get("coding"), []byte("[["+value+"]]"))
	case "/status":
		hijackStatus(rw, value)
	case "/malformed":
		hijackHead(rw, "HTTP/1.1 200 OK\r\nX-Bad "+value+"\r\n\r\n")
	default:
		http.Error(rw, "unknown path", http.StatusNotFound)
	}
}

// writeSplit writes body in two writes, flushed apart, split split bytes in (the
// middle when empty): the boundary falls inside the reflected value.
func writeSplit(rw http.ResponseWriter, body, split string, contentLength bool) {
	at := len(body) / 2
	if n, err := strconv.Atoi(split); err == nil {
		at = n
	}
	if contentLength {
		rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	io.WriteString(rw, body[:at])
	rw.(http.Flusher).Flush()
	time.Sleep(20 * time.Millisecond)
	io.WriteString(rw, body[at:])
}

func writeCompressed(rw http.ResponseWriter, coding string, body []byte) {
	rw.Header().Set("Content-Encoding", coding)
	rw.Write(compressed(coding, body))
}

// compressed is body in coding, by the real libraries.
func compressed(coding string, body []byte) []byte {
	var buf bytes.Buffer
	var enc io.WriteCloser
	switch coding {
	case "gzip":
		enc = gzip.NewWriter(&buf)
	case "deflate":
		enc = zlib.NewWriter(&buf)
	case "br":
		enc = brotli.NewWriter(&buf)
	case "zstd":
		enc, _ = zstd.NewWriter(&buf)
	}
	enc.Write(body)
	enc.Close()
	return buf.Bytes()
}

// hijackStatus answers with the value as the status line's reason phrase.
func hijackStatus(rw http.ResponseWriter, value string) {
	conn, brw, err := rw.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	brw.WriteString("HTTP/1.1 200 " + value + "\r\nContent-Length: 2\r\n\r\nok")
	brw.Flush()
}

// hijackHead answers with head as written, malformed or not.
func hijackHead(rw http.ResponseWriter, head string) {
	conn, brw, err := rw.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	brw.WriteString(head)
	brw.Flush()
}

// fetch is one GET through an intercepted tunnel to host, over HTTP/1.1 (read
// from the raw TLS stream, every byte kept) or HTTP/2. raw is what the client
// received: the bytes on HTTP/1.1, the decoded head, body and trailers on HTTP/2.
type fetched struct {
	resp *http.Response
	body []byte
	raw  []byte
}

func (w *world) fetch(t *testing.T, proto, host, target string, hdr http.Header) fetched {
	t.Helper()
	if proto == "h2" {
		return w.fetchH2(t, host, target, hdr)
	}
	tc, _ := w.interceptedH1(t, host)
	var raw bytes.Buffer
	br := bufio.NewReader(io.TeeReader(tc, &raw))
	head := "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n"
	for k, vs := range hdr {
		for _, v := range vs {
			head += k + ": " + v + "\r\n"
		}
	}
	io.WriteString(tc, head+"\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", proto, target, err)
	}
	return fetched{resp, body, raw.Bytes()}
}

func (w *world) fetchH2(t *testing.T, host, target string, hdr http.Header) fetched {
	t.Helper()
	cc := w.h2ClientConn(t, host+":443")
	req, _ := http.NewRequest("GET", "https://"+host+target, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("h2 %s: reading the body: %v", target, err)
	}
	var raw bytes.Buffer
	resp.Header.Write(&raw)
	raw.Write(body)
	resp.Trailer.Write(&raw)
	fmt.Fprintf(&raw, "%s\n", resp.Status)
	return fetched{resp, body, raw.Bytes()}
}

var protos = []string{"h1", "h2"}

// TestScrubBodyForms: a body that reflects the credential, in each encoding, split
// across the upstream's writes at several points, chunked or with a Content-Length,
// reaches the client with each occurrence masked in place, over HTTP/1.1 and HTTP/2.
func TestScrubBodyForms(t *testing.T) {
	w := newScrubWorld(t)
	for _, proto := range protos {
		for name, enc := range encodings {
			form := enc(formsToken)
			for _, split := range []int{2, 3, 2 + len(form)/2, 1 + len(form)} {
				for _, cl := range []string{"", "&cl=1"} {
					target := fmt.Sprintf("/body?form=%s&split=%d%s", name, split, cl)
					got := w.fetch(t, proto, "forms.allowed.test", target, nil)
					// The upstream pauses 20 ms between its writes: held bytes shorter
					// than scrub.MinLen may then go out as they are (docs/policy.md).
					want := "[[" + stars(len(form)) + "]]"
					released := "[[" + form[:max(split-2, 0)] + stars(len(form)-max(split-2, 0)) + "]]"
					if string(got.body) != want && (split-2 >= scrub.MinLen || string(got.body) != released) {
						t.Errorf("%s %s: body %q, want %q", proto, target, got.body, want)
					}
					assertNoLeak(t, proto+" "+target, got.raw)
				}
			}
		}
	}
	line := w.lastLog("")
	if line["scrubbed"] != float64(1) || line["rule"] != "forms.allowed.test" {
		t.Errorf("log line: scrubbed %v, rule %v", line["scrubbed"], line["rule"])
	}
	w.assertScrubLogged(t, "forms.allowed.test", "forms")
}

// TestScrubHeadAndTrailers: the credential in Location, Set-Cookie,
// WWW-Authenticate, a header's name, a trailer and the status text is masked.
func TestScrubHeadAndTrailers(t *testing.T) {
	w := newScrubWorld(t)
	value := "Bearer " + secretToken
	for _, proto := range protos {
		got := w.fetch(t, proto, "api.allowed.test", "/header", nil)
		assertNoLeak(t, proto+" /header", got.raw)
		h := got.resp.Header
		if loc := h.Get("Location"); loc != "https://cb.test/?code="+stars(len(secretToken)) {
			t.Errorf("%s: Location %q", proto, loc)
		}
		if c := h.Get("Set-Cookie"); c != "sess="+stars(len(base64.StdEncoding.EncodeToString([]byte(value))))+"; Path=/" {
			t.Errorf("%s: Set-Cookie %q", proto, c)
		}
		if a := h.Get("Www-Authenticate"); !strings.Contains(a, `token="`+stars(len(secretToken))+`"`) {
			t.Errorf("%s: WWW-Authenticate %q", proto, a)
		}
		if h.Get("X-Echo-"+stars(len(secretToken))) != "1" {
			t.Errorf("%s: the header named after the credential is not masked: %v", proto, h)
		}
		got = w.fetch(t, proto, "api.allowed.test", "/trailer", nil)
		assertNoLeak(t, proto+" /trailer", got.raw)
		if tr := got.resp.Trailer.Get("X-Echo-Trailer"); tr != stars(len(value)) {
			t.Errorf("%s: trailer %q, want it masked", proto, tr)
		}
		// Declared trailer names reach an HTTP/1.1 client re-cased (canonical), in the
		// Trailer field written before the trailers themselves.
		if raw := strings.ToLower(string(got.raw)); strings.Contains(raw, strings.ToLower(secretToken)) {
			t.Errorf("%s: a trailer's name or its declaration carries the credential, in some case:\n%s", proto, got.raw)
		}
	}
	// The status text: egressd writes the canonical text for the code, so the
	// upstream's reason phrase never reaches the client (HTTP/2 has none).
	got := w.fetch(t, "h1", "api.allowed.test", "/status", nil)
	assertNoLeak(t, "status line", got.raw)
	w.assertScrubLogged(t, "api.allowed.test", "api")
}

// TestMalformedAnswerNotLogged: an upstream's malformed head that quotes the
// injected value fails the request (502) without the value reaching the client
// or the log line's error, which quotes the malformed line.
func TestMalformedAnswerNotLogged(t *testing.T) {
	w := newScrubWorld(t)
	got := w.fetch(t, "h1", "api.allowed.test", "/malformed", nil)
	if got.resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", got.resp.StatusCode)
	}
	assertNoLeak(t, "malformed head", got.raw)
	var line map[string]any
	waitFor(t, func() bool {
		for _, l := range w.logLines() {
			if l["path"] == "/malformed" {
				line = l
			}
		}
		return line != nil
	}, "the request's log line")
	if e, _ := line["error"].(string); !strings.Contains(e, "malformed") || strings.Contains(e, secretToken) {
		t.Errorf("log error %q: want the parse error with the value masked", e)
	}
	if strings.Contains(w.logs.String(), secretToken) {
		t.Error("the log holds the injected value")
	}
}

// TestScrubCompressedBodies: the client asks for compression; egressd narrows
// that to identity, and when the upstream compresses anyway the body is decoded,
// masked and delivered as identity, re-framed.
func TestScrubCompressedBodies(t *testing.T) {
	w := newScrubWorld(t)
	value := "Bearer " + secretToken
	for _, proto := range protos {
		for _, coding := range []string{"gzip", "deflate", "br", "zstd"} {
			got := w.fetch(t, proto, "api.allowed.test", "/compressed?coding="+coding,
				http.Header{"Accept-Encoding": {"gzip, deflate, br, zstd"}})
			if want := "[[" + stars(len(value)) + "]]"; string(got.body) != want {
				t.Errorf("%s %s: body %q, want %q", proto, coding, got.body, want)
			}
			if ce := got.resp.Header.Get("Content-Encoding"); ce != "" {
				t.Errorf("%s %s: Content-Encoding %q on a decoded body", proto, coding, ce)
			}
			assertNoLeak(t, proto+" "+coding, got.raw)
		}
	}
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		json.NewEncoder(rw).Encode(markInjected(r.Header))
	})
	got := w.fetch(t, "h1", "api.allowed.test", "/", http.Header{"Accept-Encoding": {"gzip, br"}})
	var seen http.Header
	json.Unmarshal(got.body, &seen)
	if ae := seen.Values("Accept-Encoding"); len(ae) != 1 || ae[0] != "identity" {
		t.Errorf("upstream Accept-Encoding %q, want identity on an injected request", ae)
	}
}

// TestScrubPlainHTTP: an allow_plaintext entry's response is scrubbed too
// (explicit proxy, HTTP/1.1 chunked).
func TestScrubPlainHTTP(t *testing.T) {
	w := newScrubWorld(t)
	resp := w.raw("GET http://plain.allowed.test/body?form=raw HTTP/1.1\r\nHost: plain.allowed.test\r\n\r\n")
	body, _ := io.ReadAll(resp.Body)
	if want := "[[" + stars(len(secretToken)) + "]]"; string(body) != want {
		t.Errorf("body %q, want %q", body, want)
	}
}

// TestNonInjectedResponseUntouched: a response to a request egressd injected
// nothing into passes byte for byte (a compressed body stays compressed, headers
// and Accept-Encoding as sent), even when it holds the credential's value.
func TestNonInjectedResponseUntouched(t *testing.T) {
	w := newScrubWorld(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "[["+secretToken+"]]")
	zw.Close()
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Set-Cookie", "c="+secretToken)
		rw.Header().Set("X-Accept-Encoding", r.Header.Get("Accept-Encoding"))
		rw.Header().Set("Content-Encoding", "gzip")
		rw.Write(gz.Bytes())
	})
	resp := w.raw("GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\nAccept-Encoding: gzip\r\n\r\n")
	body, _ := io.ReadAll(resp.Body)
	if !bytes.Equal(body, gz.Bytes()) {
		t.Errorf("body changed: %q, want %q", body, gz.Bytes())
	}
	if resp.Header.Get("Set-Cookie") != "c="+secretToken || resp.Header.Get("Content-Encoding") != "gzip" ||
		resp.Header.Get("X-Accept-Encoding") != "gzip" {
		t.Errorf("headers changed: %v", resp.Header)
	}
	if line := w.lastLog(""); line["scrubbed"] != float64(0) {
		t.Errorf("scrubbed = %v on a request without injection", line["scrubbed"])
	}
}

// assertScrubLogged checks the canonical lines, the metric and the one WARN for
// (rule, credential), and that no form of a value reached the log.
func (w *world) assertScrubLogged(t *testing.T, rule, credential string) {
	t.Helper()
	logs := w.logs.Bytes()
	for _, f := range leakForms() {
		if bytes.Contains(logs, []byte(f)) {
			t.Errorf("the log holds an injected value (form %q)", f)
		}
	}
	warns := 0
	for _, line := range bytes.Split(logs, []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["level"] == "warn" && strings.Contains(fmt.Sprint(m["message"]), "reflected") &&
			m["rule"] == rule && m["credential"] == credential {
			warns++
		}
	}
	if warns != 1 {
		t.Errorf("%d WARN lines for rule %s credential %s, want exactly 1", warns, rule, credential)
	}
	if n := w.scrubbedTotal(t)[rule]; n < 1 {
		t.Errorf("egressd_scrubbed_total{rule=%q} = %v", rule, n)
	}
}

// TestScrubbedMetricExportedAtStart: every injecting rule has its zero series
// before any traffic.
func TestScrubbedMetricExportedAtStart(t *testing.T) {
	w := newScrubWorld(t)
	got := w.scrubbedTotal(t)
	for _, rule := range []string{"api.allowed.test", "forms.allowed.test", "plain.allowed.test"} {
		if v, ok := got[rule]; !ok || v != 0 {
			t.Errorf("scrubbed_total{rule=%q} at start: %v %v, want an exported 0", rule, v, ok)
		}
	}
	if len(got) != 3 {
		t.Errorf("scrubbed_total series at start: %v, want the 3 injecting rules", got)
	}
}

// scrubbedTotal reads egressd_scrubbed_total by rule from the registry.
func (w *world) scrubbedTotal(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := w.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "egressd_scrubbed_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestScrubRefusesWhatItCannotRead: a body in a content coding the scrubber does
// not decode, and an injected WebSocket upgrade on which the upstream negotiated
// an extension (frame compression), are refused rather than delivered unscrubbed.
func TestScrubRefusesWhatItCannotRead(t *testing.T) {
	w := newScrubWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		value, _ := injected(r)
		if r.URL.Path == "/ws" {
			conn, brw, err := rw.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
				"Sec-WebSocket-Accept: x\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n" + value)
			brw.Flush()
			return
		}
		rw.Header().Set("Content-Encoding", "compress")
		io.WriteString(rw, value)
	})
	for _, proto := range protos {
		got := w.fetch(t, proto, "api.allowed.test", "/x", nil)
		if got.resp.StatusCode != http.StatusBadGateway || got.resp.Header.Get("Egressd-Reason") != "upstream_unreachable" {
			t.Errorf("%s: Content-Encoding compress: %s", proto, got.resp.Status)
		}
		assertNoLeak(t, proto+" compress", got.raw)
	}
	got := w.fetch(t, "h1", "api.allowed.test", "/ws", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"},
		"Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}})
	if got.resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(got.body), "websocket_extension") {
		t.Errorf("upgrade with an extension: %s %s", got.resp.Status, got.body)
	}
	assertNoLeak(t, "upgrade", got.raw)
}

// TestScrubHookResponses: a hook call to an entry that injects gets its
// endpoint's answer masked too, pre-tool (the verdict is read first) and post-tool.
func TestScrubHookResponses(t *testing.T) {
	const hookKey = "hook-key-0123456789"
	w := newWorld(t, worldOpts{hooksJSON: hooksJSON, hookBodyBytes: 4096, credentials: map[string]string{},
		allowlist: []allowlist.Entry{{Domain: "policy.allowed.test", Transform: []allowlist.Header{{Name: "X-Hook-Key", Value: hookKey}}}}})
	w.DNS.Set("policy.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("X-Seen", r.Header.Get("X-Hook-Key"))
		json.NewEncoder(rw).Encode(map[string]string{"decision": "deny", "reason": "bad key " + r.Header.Get("X-Hook-Key")})
	})
	for _, path := range []string{"/pre", "/post"} {
		req, _ := http.NewRequest("POST", "https://policy.allowed.test"+path, strings.NewReader(`{"tool":"code_execution"}`))
		resp, err := w.interceptingClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), hookKey) || resp.Header.Get("X-Seen") != stars(len(hookKey)) {
			t.Errorf("%s: the hook's answer carries the injected value: %v %s", path, resp.Header, body)
		}
		if !strings.Contains(string(body), `"decision":"deny"`) {
			t.Errorf("%s: the verdict did not pass: %s", path, body)
		}
	}
}
