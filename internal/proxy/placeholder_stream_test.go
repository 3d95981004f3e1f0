package proxy_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// Placeholders where the request streams: names and trailers, bodies the upstream
// reads as they arrive, WebSocket messages. Each refusal is asserted on what the
// upstream itself recorded: nothing, or a truncated request without the placeholder.

// bodySeen is one request as the upstream read it: the body up to where reading
// ended, how it ended, and the trailers it got.
type bodySeen struct {
	body    []byte
	err     error
	trailer http.Header
}

// upstreamLog records every request the world's upstream reads.
type upstreamLog struct {
	mu   sync.Mutex
	seen []bodySeen
}

// recordBodies makes the upstream read each body to its end (or failure), record it,
// and answer 200.
func (w *world) recordBodies() *upstreamLog {
	l := &upstreamLog{}
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		l.mu.Lock()
		l.seen = append(l.seen, bodySeen{b, err, r.Trailer.Clone()})
		l.mu.Unlock()
	})
	return l
}

// all waits briefly for the upstream handlers to finish reading, then returns what
// they recorded.
func (l *upstreamLog) all(want int) []bodySeen {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		n := len(l.seen)
		l.mu.Unlock()
		if n >= want {
			break
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bodySeen{}, l.seen...)
}

// assertTruncated fails unless the upstream read exactly one request, whose body
// ended in an error (the request was aborted), holding no more than allowed of what
// the client sent.
func assertTruncated(t *testing.T, l *upstreamLog, allowed string, ph string) {
	t.Helper()
	seen := l.all(1)
	if len(seen) != 1 {
		t.Fatalf("the upstream read %d requests, want the one aborted", len(seen))
	}
	s := seen[0]
	if s.err == nil {
		t.Errorf("the upstream read a complete body of %d bytes: the request was not aborted", len(s.body))
	}
	if !strings.HasPrefix(allowed, string(s.body)) {
		t.Errorf("the upstream read %d bytes that are not a prefix of the %d allowed", len(s.body), len(allowed))
	}
	for k, vs := range s.trailer {
		if strings.Contains(strings.ToLower(k+strings.Join(vs, ",")), strings.ToLower(ph)) {
			t.Error("the upstream got the placeholder in a trailer")
		}
	}
}

// TestPlaceholderRefusedInPathNamesAndTrailers: in the path (raw, or percent-encoded in
// either case), a header name, a declared trailer name, even toward the trusted host,
// a placeholder is credential_scope and the upstream gets nothing.
func TestPlaceholderRefusedInPathNamesAndTrailers(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	allEncoded := ""
	for i := 0; i < len(ev); i++ {
		allEncoded += fmt.Sprintf("%%%02x", ev[i])
	}
	cases := []struct{ name, head, detail string }{
		{"path", "GET http://other.test/a/" + ev + " HTTP/1.1\r\nHost: other.test\r\n", "path"},
		{"path %5F", "GET http://other.test/a/" + strings.ReplaceAll(ev, "_", "%5F") + "?x=1 HTTP/1.1\r\nHost: other.test\r\n", "path"},
		{"path all %xx", "GET http://other.test/" + allEncoded + " HTTP/1.1\r\nHost: other.test\r\n", "path"},
		{"path, trusted host", "GET http://api.allowed.test/" + ev + " HTTP/1.1\r\nHost: api.allowed.test\r\n", "path"},
		{"method", ev + " http://other.test/ HTTP/1.1\r\nHost: other.test\r\n", "method"},
		{"method, prefixed, trusted host", "X" + ev + " http://api.allowed.test/ HTTP/1.1\r\nHost: api.allowed.test\r\n", "method"},
		{"header name", "GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\nX-" + ev + ": 1\r\n", "header_name"},
		{"header name, trusted host", "GET http://api.allowed.test/ HTTP/1.1\r\nHost: api.allowed.test\r\n" + ev + ": 1\r\n", "header_name"},
		{"trailer name", "POST http://other.test/ HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\nTrailer: X-" + ev + "\r\n", "trailer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := w.Upstream.requests.Load()
			body := ""
			if strings.Contains(tc.head, "chunked") {
				body = "5\r\nhello\r\n0\r\nX-" + ev + ": 1\r\n\r\n"
			}
			assertRefused(t, w.raw(tc.head+"\r\n"+body), 403, "credential_scope", tc.detail)
			if n := w.Upstream.requests.Load() - before; n != 0 {
				t.Errorf("the upstream got %d requests", n)
			}
		})
	}
	if !strings.Contains(string(w.logs.Bytes()), `"location":"header_name"`) {
		t.Error("no WARN naming the location")
	}
	w.assertValueNotLogged()
}

// TestPlaceholderRefusedInTrailerValue: a trailer value arrives when the body ends,
// after the body has streamed: the request is aborted before its end (no trailers),
// and the client gets credential_scope.
func TestPlaceholderRefusedInTrailerValue(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	seen := w.recordBodies()
	resp := w.raw("POST http://other.test/ HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n" +
		"5\r\nhello\r\n0\r\nX-T: " + ev + "\r\n\r\n")
	assertRefused(t, resp, 403, "credential_scope", "trailer")
	assertTruncated(t, seen, "hello", ev)
}

// TestPlaceholderInLargeBodyRefused: a 2 MiB body with the placeholder at its end
// streams to the upstream, which never gets the placeholder: the request is aborted
// there (the upstream's read fails) and the client gets credential_scope. Over plain
// HTTP, and intercepted over HTTP/1.1 and HTTP/2 for a credential that may go to the
// host in headers only.
func TestPlaceholderInLargeBodyRefused(t *testing.T) {
	w := newPlaceholderWorld(t)
	filler := strings.Repeat("a", 2<<20)
	for _, tc := range []struct{ name, url, ph, proto string }{
		{"plain http", "http://other.test/upload", w.ph("EV_KEY"), "h1"},
		{"intercepted h1", "https://api.allowed.test/upload", w.ph("HDR_KEY"), "h1"},
		{"intercepted h2", "https://api.allowed.test/upload", w.ph("HDR_KEY"), "h2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := w.recordBodies()
			req, _ := http.NewRequest("POST", tc.url, strings.NewReader(filler+tc.ph))
			var resp *http.Response
			var err error
			if tc.proto == "h2" {
				resp, err = w.h2ClientConn(t, "api.allowed.test:443").RoundTrip(req)
			} else {
				resp, err = w.interceptingClient().Do(req)
			}
			if err != nil {
				t.Fatal(err)
			}
			assertRefused(t, resp, 403, "credential_scope", "body")
			assertTruncated(t, seen, filler, tc.ph)
		})
	}
	if n := strings.Count(string(w.logs.Bytes()), `"location":"body","message":"credential placeholder outside its scope refused"`); n != 3 {
		t.Errorf("%d WARN lines for the body, want 3", n)
	}
	w.assertValueNotLogged()
}

// TestPlaceholderAfterTheAnswer: an upstream that answers before it has read the body
// still never gets the placeholder that comes later: the body is cut there, the
// exchange ends, and its line says credential_scope.
func TestPlaceholderAfterTheAnswer(t *testing.T) {
	w := newPlaceholderWorld(t)
	hdr := w.ph("HDR_KEY")
	seen := &upstreamLog{}
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, "ready\n")
		rw.(http.Flusher).Flush()
		b, err := io.ReadAll(r.Body)
		seen.mu.Lock()
		seen.seen = append(seen.seen, bodySeen{b, err, nil})
		seen.mu.Unlock()
	})
	pw, resp := w.h2Stream(t, "/early", "first ")
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if resp.StatusCode != 200 || line != "ready\n" {
		t.Fatalf("%d %q", resp.StatusCode, line)
	}
	io.WriteString(pw, "then "+hdr)
	assertTruncated(t, seen, "first then ", hdr)
	l := w.waitLog(t, func(l map[string]any) bool { return l["path"] == "/early" })
	if l["reason"] != "credential_scope" || l["detail"] != "body" {
		t.Errorf("logged %v / %v, want credential_scope / body", l["reason"], l["detail"])
	}
	pw.Close()
}

// TestPlaceholderSplitAcrossWrites: a chunked body whose placeholder the client
// writes in two pieces, pausing between them, is aborted when the second arrives. Cut
// after its prefix, nothing of it left egressd (held back while the client paused);
// cut inside the prefix, at most that beginning did ("egr", released so that a
// stream ending in it is not held).
func TestPlaceholderSplitAcrossWrites(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	for _, cut := range []int{3, len("egressd_ph_") + 4} {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			seen := w.recordBodies()
			c, br := w.dialProxy(t)
			first := "abc " + ev[:cut]
			io.WriteString(c, "POST http://other.test/ HTTP/1.1\r\nHost: other.test\r\nTransfer-Encoding: chunked\r\n\r\n"+
				strconv.FormatInt(int64(len(first)), 16)+"\r\n"+first+"\r\n")
			time.Sleep(150 * time.Millisecond)
			rest := ev[cut:] + " xyz"
			io.WriteString(c, strconv.FormatInt(int64(len(rest)), 16)+"\r\n"+rest+"\r\n0\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			assertRefused(t, resp, 403, "credential_scope", "body")
			assertTruncated(t, seen, "abc "+ev[:min(cut, len("egressd_ph_")-1)], ev)
		})
	}
}

// TestPlaceholderStreamedReplacement: a 2 MiB body to the trusted domain streams with
// the value in place of the placeholder; its length is unknown until the end, so it
// goes chunked.
func TestPlaceholderStreamedReplacement(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	filler := strings.Repeat("b", 2<<20)
	req, _ := http.NewRequest("PUT", "https://api.allowed.test/upload", strings.NewReader(ev+filler+ev))
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	seen := w.lastUpstreamRequest(t)
	if seen.Body != envValue+filler+envValue {
		t.Errorf("the upstream got %d bytes, not the body with the value in place", len(seen.Body))
	}
	if seen.ContentLength != -1 || !slicesEq(seen.TransferEncoding, []string{"chunked"}) {
		t.Errorf("framing: Content-Length %d, TE %v; want chunked", seen.ContentLength, seen.TransferEncoding)
	}
	w.assertValueNotLogged()
}

// TestPlaceholderBidiStream: an HTTP/2 request body that never ends (a bidirectional
// stream, written as gRPC writes: before the response has begun) to the trusted
// domain works message by message: a message that ends in "e" (the start of every
// placeholder) reaches the upstream while the client waits for its answer, and a
// later message has its placeholder replaced while the stream stays open. When the
// upstream then ends the exchange, the client's stream ends at once, although egressd
// is still waiting for the client's next bytes.
func TestPlaceholderBidiStream(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	var mu sync.Mutex
	var got bytes.Buffer
	last := "key=" + envValue + " e"
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 4096)
		for {
			n, err := r.Body.Read(buf)
			mu.Lock()
			got.Write(buf[:n])
			done := strings.HasSuffix(got.String(), last)
			mu.Unlock()
			if done {
				return
			}
			if n > 0 {
				fmt.Fprintf(rw, "got %d\n", n)
				rw.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	})
	upstreamHas := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			s := got.String()
			mu.Unlock()
			if s == want {
				return
			}
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the upstream has %q while the stream is open, want %q", got.String(), strings.ReplaceAll(want, envValue, "<value>"))
	}
	pw, resp := w.h2Stream(t, "/stream", "ping e")
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, resp.Body); ended <- err }()
	upstreamHas("ping e")
	io.WriteString(pw, "key="+ev+" e")
	upstreamHas("ping e" + last)
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the response ended with %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("the upstream ended the exchange, the client's stream did not end")
	}
	pw.Close()
}

// TestPlaceholderWebSocketMessageClosesConnection: on an intercepted WebSocket, a
// message without a placeholder passes; one with a placeholder (whole, or split
// across the frames of a fragmented message) closes the connection before the
// upstream has it: credential_scope, detail websocket, on the upgrade's line. The
// upstream is offered no extension (permessage-deflate would hide the frames). Of a
// fragmented message the upstream may get the first frame, the placeholder's
// beginning in it masked (it cannot wait for the next frame).
func TestPlaceholderWebSocketMessageClosesConnection(t *testing.T) {
	w := newPlaceholderWorld(t)
	ev := w.ph("EV_KEY")
	var mu sync.Mutex
	var msgs, extensions []string
	ended := make(chan struct{}, 2)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		defer func() { ended <- struct{}{} }()
		mu.Lock()
		extensions = append(extensions, r.Header.Values("Sec-Websocket-Extensions")...)
		mu.Unlock()
		websocket.Handler(func(ws *websocket.Conn) {
			for {
				var m string
				if err := websocket.Message.Receive(ws, &m); err != nil {
					return
				}
				mu.Lock()
				msgs = append(msgs, m)
				mu.Unlock()
				websocket.Message.Send(ws, "echo:"+m)
			}
		}).ServeHTTP(rw, r)
	})
	for _, fragmented := range []bool{false, true} {
		t.Run(fmt.Sprintf("fragmented=%v", fragmented), func(t *testing.T) {
			mu.Lock()
			msgs = nil
			mu.Unlock()
			tc, _ := w.interceptedH1(t, "api.allowed.test")
			conf, _ := websocket.NewConfig("wss://api.allowed.test/ws", "https://api.allowed.test")
			conf.Header = http.Header{"Sec-Websocket-Extensions": {"permessage-deflate"}}
			ws, err := websocket.NewClient(conf, tc)
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			var echo string
			if websocket.Message.Send(ws, "hello"); websocket.Message.Receive(ws, &echo) != nil || echo != "echo:hello" {
				t.Fatalf("echo %q: a message without a placeholder must pass", echo)
			}
			if fragmented {
				tc.Write(wsFrame(false, 1, "abc "+ev[:20]))
				time.Sleep(50 * time.Millisecond)
				tc.Write(wsFrame(true, 0, ev[20:]))
			} else {
				websocket.Message.Send(ws, "key="+ev)
			}
			tc.SetReadDeadline(time.Now().Add(5 * time.Second))
			for websocket.Message.Receive(ws, &echo) == nil { // the first fragment's echo may come
			}
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the connection stayed open")
			}
			mu.Lock()
			got := msgs
			mu.Unlock()
			// What the upstream may get besides "hello": the message's frame header alone
			// ("", the payload cut), the first fragment with the placeholder's start masked.
			for _, m := range got[1:] {
				if m != "" && (!fragmented || m != "abc "+strings.Repeat("*", 20)) {
					t.Errorf("the upstream got %q", m)
				}
			}
			line := w.waitLog(t, func(l map[string]any) bool { return l["status"] == float64(101) && l["reason"] != "" })
			if line["reason"] != "credential_scope" || line["detail"] != "websocket" {
				t.Errorf("upgrade logged %v / %v, want credential_scope / websocket", line["reason"], line["detail"])
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(extensions) != 0 {
		t.Errorf("the upstream was offered %q: compressed frames could not be searched", extensions)
	}
}

// h2Stream starts a request to api.allowed.test over HTTP/2 whose body streams from
// the returned writer, first written before the response has begun (as gRPC does).
func (w *world) h2Stream(t *testing.T, path, first string) (*io.PipeWriter, *http.Response) {
	t.Helper()
	pr, pw := io.Pipe()
	go io.WriteString(pw, first)
	req, _ := http.NewRequest("POST", "https://api.allowed.test"+path, pr)
	resp, err := w.h2ClientConn(t, "api.allowed.test:443").RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close(); pw.Close() })
	return pw, resp
}

// wsFrame is one client frame (masked, as clients must), opcode op.
func wsFrame(fin bool, op byte, payload string) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	default:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	}
	var key [4]byte
	rand.Read(key[:])
	f = append(f, key[:]...)
	for i := 0; i < len(payload); i++ {
		f = append(f, payload[i]^key[i%4])
	}
	return f
}
