package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/config"
)

// loadMargin is added to timing bounds: the deny leaves egressd 0.5 s before the
// hook's timeout, but a loaded test machine can delay the client that measures it.
const loadMargin = time.Second

// A hook body trickled in one byte at a time, each byte well within
// limits.read_header, must still end in the fail-closed deny within the hook's
// deadline (2 s timeout - 0.5 s): egressd reads hook bodies itself, and a per-read
// deadline alone would let the call, and its connection slot, last for ever.
func TestHookBodyTrickleDeniedWithinDeadline(t *testing.T) {
	w := newHookWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, `{"decision":"allow"}`) })
	tc, br := w.interceptedH1(t, "policy.allowed.test")
	io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 100\r\n\r\n")
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; i < 100; i++ {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
				tc.Write([]byte("x"))
			}
		}
	}()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	took := time.Since(start)
	if resp.StatusCode != 200 || body["decision"] != "deny" || resp.Header.Get("Egressd-Hook") != "fail-closed" {
		t.Fatalf("runtime got %d %v, want egressd's deny", resp.StatusCode, body)
	}
	if took > 2*time.Second+loadMargin {
		t.Errorf("deny after %v, past the hook's 2 s timeout", took)
	}
}

// The same over HTTP/2: the stream's body is read under the hook's deadline.
func TestHookBodyTrickleDeniedWithinDeadlineH2(t *testing.T) {
	w := newHookWorld(t)
	cc := w.h2ClientConn(t, "policy.allowed.test:443")
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		for i := 0; i < 100; i++ {
			time.Sleep(300 * time.Millisecond)
			if _, err := pw.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", pr)
	start := time.Now()
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != 200 || body["decision"] != "deny" {
		t.Fatalf("runtime got %d %v, want egressd's deny", resp.StatusCode, body)
	}
	if took := time.Since(start); took > 2*time.Second+loadMargin {
		t.Errorf("deny after %v, past the hook's 2 s timeout", took)
	}
}

// A hook call with Expect: 100-continue gets its 100 from egressd at once, which
// reads the body itself; waiting for the endpoint's (which never comes: the
// transport sends the body unasked) would cost the runtime its 1 s continue wait.
func TestHookExpectContinueAnswered(t *testing.T) {
	w := newHookWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	tc, br := w.interceptedH1(t, "policy.allowed.test")
	io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	tc.SetReadDeadline(time.Now().Add(700 * time.Millisecond))
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("first answer %q (%v), want 100 Continue at once", line, err)
	}
	br.ReadString('\n') // the blank line after the 100
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(tc, "{}")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	if body["decision"] != "allow" {
		t.Fatalf("got %d %v, want the endpoint's allow", resp.StatusCode, body)
	}
}

// A client that sends a request and never reads the answer is closed after
// limits.client_write: its request ends (and is logged) instead of holding the
// connection, its slot and the upstream connection for ever.
func TestClientThatNeverReadsIsClosed(t *testing.T) {
	w := newWorld(t, worldOpts{limits: func(l *config.Limits) { l.ClientWrite = 300 * time.Millisecond }})
	chunk := strings.Repeat("x", 64<<10)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		for i := 0; i < 2048 && r.Context().Err() == nil; i++ { // 128 MiB at most
			if _, err := io.WriteString(rw, chunk); err != nil {
				return
			}
		}
	})
	c := w.connectRaw(t)
	io.WriteString(c, "GET http://allowed.test/big HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	line := w.waitLog(t, func(l map[string]any) bool { return l["path"] == "/big" })
	if line["status"] != float64(200) {
		t.Errorf("log line %v", line)
	}
}

// A stalled request body inside an intercepted HTTP/2 connection, once forwarded,
// is given up after limits.stream_idle without a byte, like an HTTP/1 one: 400
// body_timeout, not a stream held until the upstream's response timeout.
func TestH2StalledBodyTimesOut(t *testing.T) {
	w := newInjectWorld(t, worldOpts{limits: func(l *config.Limits) {
		l.ReadHeader, l.StreamIdle = 500*time.Millisecond, time.Second
	}})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rw.WriteHeader(204)
	})
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("a few bytes, then nothing"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://api.allowed.test/upload", pr)
	start := time.Now()
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	assertRefusedStatus(t, resp, 400, "bad_request")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("answered after %v", took)
	}
}

func assertRefusedStatus(t *testing.T, resp *http.Response, status int, reason string) {
	t.Helper()
	if resp.StatusCode != status || resp.Header.Get("Egressd-Reason") != reason {
		t.Fatalf("got %d %q, want %d %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"), status, reason)
	}
}

// connectRaw opens a plain connection to the proxy, closed when the test ends.
func (w *world) connectRaw(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", w.ProxyAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Buffered hook bodies share one process-wide budget: while stalled hook bodies
// hold it (their bytes sent, two clients each holding its half of it), a
// pre-tool call gets the fail-closed deny at once, a post-tool call 503
// overloaded; once they are gone, calls are served again.
func TestHookBufferBudget(t *testing.T) {
	w := newAllowHookWorld(t, func(l *config.Limits) { l.HookBodyBytes, l.HookBufferBytes = 64<<10, 128<<10 })
	var stalled []net.Conn
	for _, from := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} { // each call reserves 32,768 bytes
		tc, _ := w.interceptedH1From(t, from, "policy.allowed.test")
		io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 32767\r\n\r\n"+strings.Repeat("x", 30000))
		stalled = append(stalled, tc)
	}
	time.Sleep(300 * time.Millisecond) // egressd reads what was sent
	status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre")
	if status != 200 || body["decision"] != "deny" || !strings.Contains(body["reason"].(string), "overloaded") {
		t.Fatalf("pre-tool call with the budget full: %d %v, want the fail-closed deny", status, body)
	}
	req, _ := http.NewRequest("POST", "https://policy.allowed.test/post", strings.NewReader(`{"pad":"`+strings.Repeat("x", 100)+`"}`))
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	assertRefusedStatus(t, resp, 503, "overloaded")
	for _, c := range stalled {
		c.Close()
	}
	time.Sleep(300 * time.Millisecond)
	if status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre"); body["decision"] != "allow" {
		t.Fatalf("after the stall: %d %v, want the endpoint's allow", status, body)
	}
}

// interceptedH1From opens an intercepted HTTP/1.1 tunnel to host from the local
// address from (another client than 127.0.0.1, for the hook budget's shares).
func (w *world) interceptedH1From(t *testing.T, from, host string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", w.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "CONNECT "+host+":443 HTTP/1.1\r\nHost: "+host+":443\r\n\r\n")
	if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s from %s: %v %v", host, from, resp, err)
	}
	tc := tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: host, RootCAs: w.CAPool, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc, bufio.NewReader(tc)
}

// TestHookBudgetDeclaredLength: forty hook calls that each declare almost
// limits.hook_body_bytes (1 MiB) and send one byte hold one chunk each of the
// 32 MiB budget, not what they declare: a real call gets the endpoint's allow.
// Reserved by declared length they held 40 MiB, and every real call got the
// deny until they closed.
func TestHookBudgetDeclaredLength(t *testing.T) {
	w := newAllowHookWorld(t, nil)
	for range 40 {
		tc, _ := w.interceptedH1(t, "policy.allowed.test")
		io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 1048575\r\n\r\nx")
	}
	time.Sleep(300 * time.Millisecond) // egressd has read their heads and their byte
	if status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre"); status != 200 || body["decision"] != "allow" {
		t.Fatalf("real call beside 40 calls declaring 1 MiB: %d %v, want the endpoint's allow", status, body)
	}
}

// TestHookBudgetClientShare: a client that sends the bytes to fill the hook
// budget holds at most half of it; a call from another client still gets the
// endpoint's allow. Without the share, the first client took the whole budget and
// every call, from anyone, got the deny.
func TestHookBudgetClientShare(t *testing.T) {
	w := newAllowHookWorld(t, func(l *config.Limits) { l.HookBodyBytes, l.HookBufferBytes = 64<<10, 256<<10 })
	for range 8 { // 8 x 32,768 bytes: the whole budget, but for the share
		tc, _ := w.interceptedH1From(t, "127.0.0.2", "policy.allowed.test")
		io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 32767\r\n\r\n"+strings.Repeat("x", 30000))
	}
	time.Sleep(300 * time.Millisecond) // egressd has read what they sent
	if status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre"); status != 200 || body["decision"] != "allow" {
		t.Fatalf("call from another client while one holds its share: %d %v, want the endpoint's allow", status, body)
	}
}
