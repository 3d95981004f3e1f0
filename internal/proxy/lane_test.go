package proxy_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/proxy"
)

// With every connection slot held by serving connections (here: idle tunnels,
// which are never evicted), a pre-tool hook call still gets the endpoint's answer,
// in the hook lane, while anything else gets 503 overloaded. With the lane itself
// filled by fake hook calls trickling their bodies, the real call still gets an
// answer (the endpoint's, or egressd's deny) within its timeout: never a 503, a
// reset or a hang.
func TestHookLaneUnderFullSlots(t *testing.T) {
	w := newLaneWorld(t, 4)
	w.fillSlots(t, 4)
	resp, err := w.client().Get("http://allowed.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	assertRefusedStatus(t, resp, 503, "overloaded")

	status, body, took := w.hookCall(t, "https://policy.allowed.test/pre")
	if status != 200 || body["decision"] != "allow" || took > 2*time.Second+loadMargin {
		t.Fatalf("hook call with every slot held: %d %v after %v, want the endpoint's allow", status, body, took)
	}

	for i := 0; i < 40; i++ { // more fake hook calls than the lane has slots
		w.fakeHookCall(t)
	}
	time.Sleep(200 * time.Millisecond)
	for i := 0; i < 3; i++ {
		status, body, took := w.hookCall(t, "https://policy.allowed.test/pre")
		d, _ := body["decision"].(string)
		if status != 200 || (d != "allow" && d != "deny") || took > 2*time.Second+loadMargin {
			t.Fatalf("hook call with the lane full: %d %v after %v, want an answer within the timeout", status, body, took)
		}
		t.Logf("hook call with the lane full: %s after %v", d, took)
		if d == "deny" && !strings.HasSuffix(body["reason"].(string), "(fail-closed)") {
			t.Fatalf("deny %v is not egressd's", body)
		}
	}
}

// fakeHookCall is the sandbox posing as the runtime: a tunnel to the hook host and
// a hook call whose body never arrives. Errors are ignored: egressd may cut it.
func (w *world) fakeHookCall(t *testing.T) {
	c, err := net.DialTimeout("tcp", w.ProxyAddr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
		return
	}
	tc := tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
	if tc.Handshake() != nil {
		return
	}
	io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 100\r\n\r\nx")
}

// Shutdown lets requests in flight finish but does not wait for idle tunnels: it
// closes them at once (docs/observability.md: SIGTERM drains in-flight requests for at most
// limits.drain, then closes tunnels and WebSockets).
func TestShutdownClosesIdleTunnels(t *testing.T) {
	w := newWorld(t, worldOpts{})
	var tunnels []*tls.Conn
	for i := 0; i < 20; i++ {
		tc := tls.Client(w.connect(t, "allowed.test:443"), &tls.Config{ServerName: "allowed.test", RootCAs: w.UpstreamCA})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		tunnels = append(tunnels, tc)
	}
	start := time.Now()
	if err := w.Server.Shutdown(contextWithTimeout(t, 10*time.Second)); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Shutdown took %v with only idle tunnels open", took)
	}
	for _, tc := range tunnels {
		tc.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := tc.Read(make([]byte, 1)); err == nil || isTimeoutErr(err) {
			t.Fatalf("tunnel still open after Shutdown: %v", err)
		}
	}
}

func isTimeoutErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// The hook lane on a transparent listener, where the runtime's hook calls and
// every other connection from the sandbox arrive on one listener: with every slot
// held by tunnels, a ClientHello naming the hook host takes a lane slot and the
// call gets the endpoint's allow; a plain request gets 503 overloaded.
func TestHookLaneTransparent(t *testing.T) {
	w := newLaneWorld(t, 4)
	sb := w.serveTransparent(t)
	for i := 0; i < 4; i++ { // every slot: a spliced tunnel, TLS done with the upstream, then idle
		if _, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", "www.allowed.test"); err != nil {
			t.Fatal(err)
		}
	}
	c, err := sb.dial(t, "tcp", w.PublicIP+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	assertRefusedStatus(t, get(t, c, "www.allowed.test", "/"), 503, "overloaded")

	start := time.Now()
	tc, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", "policy.allowed.test")
	if err != nil {
		t.Fatalf("hook call's TLS with every slot held: %v", err)
	}
	io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"allow"`) || time.Since(start) > 2*time.Second+loadMargin {
		t.Fatalf("hook call with every slot held: %d %s after %v, want the endpoint's allow", resp.StatusCode, body, time.Since(start))
	}
}

// With a hooks listener, only its traffic is hook traffic, and its slots are its
// own: with every slot of both listeners held by tunnels, a hook call on the hooks
// listener takes that listener's lane and gets the endpoint's allow, while the
// same call on the sandbox listener is no hook call and gets 503 overloaded.
func TestHookLaneOnHooksListener(t *testing.T) {
	w := newLaneWorld(t, 4)
	snap := *w.Server.Snapshot()
	byListener := *snap.Hooks
	byListener.Identify = config.IdentifyListener
	snap.Hooks = &byListener
	w.Server.Swap(&snap)
	hooksLn := listenOn(t, "127.0.0.1:0")
	go w.Server.Serve(hooksLn, config.Listener{Name: "hooks", Mode: config.ModeProxy, Role: config.RoleHooks})
	sandboxAddr, hooksAddr := w.ProxyAddr, hooksLn.Addr().String()
	for _, addr := range []string{sandboxAddr, hooksAddr} {
		w.ProxyAddr = addr
		for i := 0; i < 4; i++ {
			tc := tls.Client(w.connect(t, "allowed.test:443"), &tls.Config{ServerName: "allowed.test", RootCAs: w.UpstreamCA})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.ProxyAddr = hooksAddr
	if status, body, took := w.hookCall(t, "https://policy.allowed.test/pre"); status != 200 || body["decision"] != "allow" || took > 2*time.Second+loadMargin {
		t.Fatalf("hook call on the full hooks listener: %d %v after %v, want the endpoint's allow", status, body, took)
	}
	w.ProxyAddr = sandboxAddr
	req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", strings.NewReader(`{}`))
	if _, err := w.interceptingClient().Do(req); err == nil || !strings.Contains(err.Error(), "Service Unavailable") {
		t.Fatalf("the same call on the full sandbox listener: %v, want its CONNECT refused 503", err)
	}
}

// TestCutLaneConnectionStillAnswered: a real call slow to send its request (its
// tunnel and TLS done, the head not yet sent, as under load) whose lane slot is
// taken by a newcomer is still answered with egressd's deny when the request comes
// after cutGrace, instead of finding its connection closed: the runtime would read
// the close as allow.
func TestCutLaneConnectionStillAnswered(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	real := w.slowHookConn(t) // the lane's oldest: cut by the lane's 33rd arrival
	for range 32 {
		w.slowHookConn(t)
	}
	time.Sleep(1500 * time.Millisecond) // past cutGrace
	wantFailClosedDeny(t, "the cut call", real)
}

// newLaneWorld is newAllowHookWorld at limits.max_connections n.
func newLaneWorld(t *testing.T, n int) *world {
	return newAllowHookWorld(t, func(l *config.Limits) { l.MaxConnections = n })
}

// newAllowHookWorld is a world with the hook entries and hooks.json, whose hook
// endpoint allows every call, with limits changed by limits (nil: the defaults).
func newAllowHookWorld(t *testing.T, limits func(*config.Limits)) *world {
	w := newWorld(t, worldOpts{allowlist: append(hookEntries, defaultEntries...), hooksJSON: hooksJSON,
		credentials: map[string]string{}, limits: limits})
	w.DNS.Set("policy.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	return w
}

// fillSlots holds n connection slots with tunnels, TLS done end to end, then idle:
// serving connections, which are never evicted.
func (w *world) fillSlots(t *testing.T, n int) {
	for range n {
		tc := tls.Client(w.connect(t, "allowed.test:443"), &tls.Config{ServerName: "allowed.test", RootCAs: w.UpstreamCA})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRealCallNotEvictedBetweenStages: at max_connections, a newcomer does not
// take the slot of a connection that has only just begun to wait for its client:
// a real hook call between the stages of its request — its CONNECT not yet read,
// its ClientHello or its request head on the way — as the runtime's calls are all
// the time when the sandbox holds every slot and the machine is loaded. Evicted,
// the call's connection was closed with no answer (an EOF in the bench's
// hook-attack row), which the runtime reads as allow. The newcomer gets 503
// overloaded instead, and the call the endpoint's allow.
func TestRealCallNotEvictedBetweenStages(t *testing.T) {
	for stage := range 3 { // waiting for: the CONNECT head, the ClientHello, the POST head
		t.Run([]string{"connect_head", "client_hello", "request_head"}[stage], func(t *testing.T) {
			w := newLaneWorld(t, 2)
			w.fillSlots(t, 1)
			c, br := w.dialProxy(t) // the last slot
			var tc *tls.Conn
			if stage >= 1 {
				io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n\r\n")
				if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
					t.Fatalf("CONNECT: %v %v", resp, err)
				}
				tc = tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
			}
			if stage == 2 {
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(50 * time.Millisecond) // egressd waits for the call's next stage
			resp := w.raw("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
			resp.Body.Close()
			if resp.StatusCode != 503 {
				t.Errorf("newcomer: %d, want 503 overloaded (not the waiting call's slot)", resp.StatusCode)
			}

			if stage == 0 {
				io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n\r\n")
				if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
					t.Fatalf("the call's CONNECT after the newcomer: %v %v (closed: the runtime reads that as allow)", resp, err)
				}
				tc = tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
			}
			if status, b := postHookCall(t, tc); status != 200 || !strings.Contains(b, `"decision":"allow"`) {
				t.Fatalf("the call after the newcomer: %d %s, want the endpoint's allow", status, b)
			}
		})
	}
}

// TestAdmittedCallNotCutByNewerArrivals: with every slot held, a real call being
// admitted to the hook lane whose head is slow to arrive (as under load) is not
// cut when hundreds of newer connections are admitted meanwhile: only one that
// has waited evictAfter for its head is, and that one is answered 503 overloaded
// (admission_evicted) before it is closed. Cut past 256 admissions, the call was
// closed with no answer and no log line.
func TestAdmittedCallNotCutByNewerArrivals(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	c, br := w.dialProxy(t)
	time.Sleep(50 * time.Millisecond) // being admitted, its head not yet sent
	var silent []net.Conn
	dialled := time.Now()
	for range 300 { // more than maxAdmitting, and than the 256 once cut whatever their age
		s, _ := w.dialProxy(t)
		silent = append(silent, s)
	}
	time.Sleep(100 * time.Millisecond)
	io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n\r\n")
	if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the call's CONNECT after 300 newer arrivals: %v %v (closed: the runtime reads that as allow)", resp, err)
	}
	tc := tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
	if status, b := postHookCall(t, tc); status != 200 || !strings.Contains(b, `"decision":"allow"`) {
		t.Fatalf("the call after 300 newer arrivals: %d %s, want the endpoint's allow", status, b)
	}

	time.Sleep(time.Until(dialled.Add(1300 * time.Millisecond))) // the first silent ones have waited evictAfter
	w.dialProxy(t)                                               // the next arrival has the oldest of them evicted
	if time.Since(dialled) > admitHead-200*time.Millisecond {
		t.Skipf("the silent connections were dialled %v ago: their admission may have ended by itself", time.Since(dialled))
	}
	evicted := 0
	for i, c := range silent {
		if wantOverloaded(t, "silent connection "+strconv.Itoa(i), c, "").Detail == "admission_evicted" {
			evicted++
		}
	}
	if evicted != 1 {
		t.Errorf("%d silent connections answered admission_evicted, want the 1 that waited longest", evicted)
	}
	w.waitLog(t, func(l map[string]any) bool { return l["detail"] == "admission_evicted" && l["reason"] == "overloaded" })
}

// admitHead is how long a connection being admitted has for its first head.
const admitHead = 2 * time.Second

// TestOverflowWaitsInBacklog: connections beyond limits.max_connections are held
// up to the listener's overflow bound; past it, newer ones wait unaccepted in the
// kernel's backlog instead of being accepted only to be closed (or an older one
// closed for them). Every one of them gets an answer in the end: here, silent
// ones, the 503 overloaded when their head never comes.
func TestOverflowWaitsInBacklog(t *testing.T) {
	const bound, conns = 100, 160
	defer proxy.SetOverflowBound(bound)()
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	var silent []net.Conn
	for range conns {
		c, _ := w.dialProxy(t)
		silent = append(silent, c)
	}
	time.Sleep(300 * time.Millisecond)
	if n := w.Server.Admitting(); n > bound {
		t.Errorf("%d connections being admitted, past the overflow bound %d", n, bound)
	}
	for i, c := range silent {
		wantOverloaded(t, "silent connection "+strconv.Itoa(i), c, "")
	}
}

// wantOverloaded reads c's answer: 503 overloaded with the given detail, then the
// close. A close without the answer fails the test.
func wantOverloaded(t *testing.T, what string, c net.Conn, detail string) refusalBody {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(8 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s closed without an answer: %v", what, err)
	}
	rb := assertRefused(t, resp, 503, "overloaded", detail)
	if _, err := br.ReadByte(); err == nil || isTimeoutErr(err) {
		t.Errorf("%s still open after its 503: %v", what, err)
	}
	return rb
}

// postHookCall sends a pre-tool hook call on tc and returns the answer's status
// and body; a connection closed without an answer fails the test.
func postHookCall(t *testing.T, tc net.Conn) (int, string) {
	t.Helper()
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	body := `{"tool":"code_execution","input":"ls"}`
	io.WriteString(tc, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Type: application/json\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("the hook call found its connection closed (%v): the runtime reads that as allow", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// wantFailClosedDeny sends a pre-tool hook call on tc and fails the test unless
// it gets egressd's fail-closed deny.
func wantFailClosedDeny(t *testing.T, what string, tc net.Conn) {
	t.Helper()
	status, b := postHookCall(t, tc)
	if status != 200 || !strings.Contains(b, `"decision":"deny"`) || !strings.Contains(b, "(fail-closed)") {
		t.Fatalf("%s got %d %s, want egressd's fail-closed deny", what, status, b)
	}
}

// TestHookLaneH2ServesOneCall: an HTTP/2 connection in the hook lane, like an
// HTTP/1.1 one, carries one call: its answer comes with a GOAWAY, so the runtime
// opens a new connection for its next call instead of sending it on one the lane
// is about to cut and close (a close racing the call reaches the runtime as a
// reset, which it reads as allow).
func TestHookLaneH2ServesOneCall(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	cc := w.h2ClientConn(t, "policy.allowed.test:443")
	req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", strings.NewReader(`{"tool":"code_execution","input":"ls"}`))
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"decision":"allow"`) {
		t.Fatalf("hook call on an HTTP/2 lane connection: %d %s, want the endpoint's allow", resp.StatusCode, b)
	}
	deadline := time.Now().Add(2 * time.Second)
	for cc.Available() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := cc.Available(); n > 0 {
		t.Errorf("the lane connection still takes %d more streams after its call, want a GOAWAY", n)
	}
}

// TestHookLaneNoSlotStillAnswered: a hook call that finds no lane slot within
// laneWait (the newcomers took those it freed by cutting) is served as a cut
// connection, holding no slot: its CONNECT is answered and its call gets
// egressd's deny. It was closed with no answer, which the runtime reads as allow.
func TestHookLaneNoSlotStillAnswered(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	defer w.Server.HoldLane()()
	tc := tls.Client(w.connect(t, "policy.allowed.test:443"), &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
	wantFailClosedDeny(t, "the call with no lane slot", tc)
}

// TestCutCallLingersPastFullLinger: a real call cut before it sent its request,
// with 64 cut connections lingering before it and 128 arriving after (the sandbox
// opened them in a burst), still has cutLinger to send it: lingering connections
// are bounded by what they cost (the listener's overflow bound), not by a count.
// At 64 lingering, the one cut longest ago was closed 1 s after its cut, with no
// answer, when its request came later than that.
func TestCutCallLingersPastFullLinger(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	for range 64 { // cut by the next 64 arrivals: 64 lingering
		w.slowHookConn(t)
	}
	real := w.slowHookConn(t) // cut by the 32nd arrival after it
	opened := time.Now()
	for range 2 * 64 {
		w.slowHookConn(t)
	}
	time.Sleep(1500 * time.Millisecond) // past cutGrace
	if took := time.Since(opened); took > cutLinger-500*time.Millisecond {
		t.Skipf("the arrivals after the call took %v: it may have been cut cutLinger ago", took)
	}
	wantFailClosedDeny(t, "the cut call", real)
}

// cutLinger is how long a cut lane connection has to send its call.
const cutLinger = 5 * time.Second

// slowHookConn opens a lane connection to the hook host, TLS done, its request
// not yet sent: a real call under load, or a fake one.
func (w *world) slowHookConn(t *testing.T) *tls.Conn {
	t.Helper()
	tc := tls.Client(w.connect(t, "policy.allowed.test:443"), &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// fillLane takes n more hook lane slots with connections that have not begun a
// call: opened before the call a test cuts, so that the call's own deadline (the
// hook's timeout) is not spent on their handshakes, however slow the machine.
func (w *world) fillLane(t *testing.T, n int) {
	t.Helper()
	for range n {
		w.slowHookConn(t)
	}
}

// waitInCall waits until a lane connection is in a hook call: the lane then cuts
// it before the connections that have not begun one.
func (w *world) waitInCall(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); w.Server.LaneCalls() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the hook call was not begun within 10s")
		}
	}
}

// TestCutCloseRecorded: a lane connection cut before it sent its call, that then
// sends nothing within cutLinger, is closed with an egress line saying so (reason
// overloaded, detail hook_lane_linger); one cut in its call is answered with the
// deny and its tunnel's line says hook_lane_cut. Both were closed with no line
// naming why.
func TestCutCloseRecorded(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	silent := w.slowHookConn(t)
	inCall := w.slowHookConn(t)
	w.fillLane(t, 30)
	io.WriteString(inCall, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 100\r\n\r\nx")
	w.waitInCall(t)
	w.slowHookConn(t) // the lane's 33rd arrival cuts the call, the 34th (below) the silent one
	inCall.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(inCall), nil)
	if err != nil {
		t.Fatalf("the cut call got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"deny"`) || !strings.Contains(string(body), "(fail-closed)") {
		t.Fatalf("the cut call got %d %s, want egressd's deny", resp.StatusCode, body)
	}
	w.slowHookConn(t)
	tunnelLine := func(detail string) func(map[string]any) bool {
		return func(l map[string]any) bool {
			return l["method"] == "CONNECT" && l["reason"] == "overloaded" && l["detail"] == detail
		}
	}
	w.waitLog(t, tunnelLine("hook_lane_cut"))
	silent.SetReadDeadline(time.Now().Add(cutLinger + 2*time.Second))
	start := time.Now()
	if n, err := silent.Read(make([]byte, 1)); err == nil || isTimeoutErr(err) {
		t.Fatalf("the silent cut connection still open after %v (read %d, %v)", time.Since(start), n, err)
	}
	w.waitLog(t, tunnelLine("hook_lane_linger"))
}

// TestCutAnswerNotReset: a call cut while its body is still coming is answered
// with the deny, and egressd then half-closes and drains what the client still
// sends before it closes. The client here sends its whole body before it reads
// the answer (as many HTTP clients do), and gives up on a failed write. Closed
// over unread bytes, the connection was reset: the client's next write failed,
// and it never read the deny, a transport error the runtime reads as allow.
func TestCutAnswerNotReset(t *testing.T) {
	w := newLaneWorld(t, 2)
	w.fillSlots(t, 2)
	call := w.slowHookConn(t)
	w.fillLane(t, 31)
	const chunk, chunks = 4 << 10, 12
	io.WriteString(call, "POST /pre HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: "+strconv.Itoa(chunk*chunks)+"\r\n\r\n")
	write := func(i int) {
		call.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := call.Write(bytes.Repeat([]byte("x"), chunk)); err != nil {
			t.Fatalf("writing the body's chunk %d after the cut: %v (the runtime gives up: allow)", i, err)
		}
	}
	write(0)
	w.waitInCall(t)
	w.slowHookConn(t)                 // the lane's 33rd arrival cuts the call
	time.Sleep(50 * time.Millisecond) // the deny is written, and egressd is done with the connection
	for i := 1; i < chunks; i++ {
		write(i)
		time.Sleep(10 * time.Millisecond)
	}
	call.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(call), nil)
	if err != nil {
		t.Fatalf("the cut call's answer was lost (%v): the runtime reads that as allow", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), `"deny"`) {
		t.Fatalf("the cut call got %d %s (%v), want egressd's deny whole", resp.StatusCode, body, err)
	}
}
