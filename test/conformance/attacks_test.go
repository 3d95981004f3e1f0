package conformance_test

import (
	"bufio"
	"cmp"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The sandbox attacks egressd itself (docs/hooks.md): it holds every connection
// slot, or fills memory, and a pre-tool hook call must still get the endpoint's answer or egressd's fail-closed deny within
// its timeout. Each scenario runs its attack from attackWorkers goroutines (each
// reopening its connection when egressd ends it), and while it runs asserts:
//   - the hook call to the live endpoint is answered within the hook's timeout: the
//     endpoint's allow when only slots are held (the hook lane), the allow or
//     egressd's deny under memory pressure (past limits.hook_buffer_bytes a pre-tool
//     call gets the deny, by design);
//   - the hook call to the endpoint that is down gets egressd's deny in time;
//   - an ordinary request gets 503 overloaded when the slots are held;
//   - egressd's RSS stays within rssBound of idle (sampled every 100 ms);
// and after the attack stops, ordinary requests are served again.

// attackSlots is limits.max_connections in the slot scenarios; attackWorkers
// exceeds it so the lane and the 503 path are exercised too.
const (
	attackSlots   = 64
	attackWorkers = 96
	attackRamp    = 3 * time.Second // the attack runs this long before the calls
)

// memoryWorkers send the large stalled hook bodies: 160 MiB at once without the
// budget; fewer under a race build, whose every byte costs far more CPU.
var memoryWorkers = 160 - 124*boolInt(egressdtest.RaceEnabled)

// raceSlack is added to the hook timeout in a race build: the attack's every byte
// costs egressd (and the machine's other tests) many times the CPU, and on a small
// machine the client measuring the answer is starved too.
var raceSlack = time.Duration(boolInt(egressdtest.RaceEnabled)) * time.Second

// bigPath is the echo upstream's large answer (writeBig).
const bigPath = "/attack/big"

// rssLimit is how far above idle egressd's RSS may go under an attack:
// rssBound, well above what the attacks cost with the hook budget and well
// below what they cost without it. A race build of egressd scales it: the race
// detector's shadow memory grows with the heap.
func rssLimit() int64 {
	return int64(rssBound) * int64(1+3*boolInt(egressdtest.RaceEnabled))
}

// writeBig writes up to 16 MiB, until the client stops taking it.
func writeBig(w http.ResponseWriter) {
	chunk := make([]byte, 64<<10)
	for range 256 {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}

type attackCase struct {
	name   string
	limits *egressdtest.Limits
	slots  bool // the attack holds connection slots (vs fills memory)
	// contested: the attack poses as hook calls, so the lane is contested and the
	// real call may get egressd's deny rather than the endpoint's allow.
	contested bool
	workers   int // default attackWorkers
	// one runs one attack connection until stop or until egressd ends it.
	one func(w *world, stop <-chan struct{})
	// shared, when set, replaces the workers: one attack over one connection.
	shared func(k *kase, stop <-chan struct{}, wg *sync.WaitGroup)
}

func TestHookUnderAttack(t *testing.T) {
	slots := &egressdtest.Limits{MaxConnections: attackSlots}
	for _, tc := range []attackCase{
		{name: "slots held by trickled hook bodies", limits: slots, slots: true, contested: true, one: trickleHookBody},
		{name: "slots held by clients that pipeline and never read", limits: slots, slots: true, one: pipelineNeverRead},
		{name: "slots held by slow uploads to an allowlisted host", limits: slots, slots: true, one: slowUpload},
		{name: "slots held by tunnels", limits: slots, slots: true, one: heldTunnel},
		{name: "memory: many large stalled hook bodies", one: largeStalledHookBody, workers: memoryWorkers},
		{name: "memory: many HTTP/2 streams on one connection", shared: h2StalledStreams},
	} {
		t.Run(tc.name, func(t *testing.T) { runAttack(t, tc) })
	}
}

func runAttack(t *testing.T, tc attackCase) {
	w := hooksWorld(t, config{limits: tc.limits})
	k := w.begin(t)
	idle := w.rss(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopAttack := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopAttack)
	if tc.shared != nil {
		tc.shared(k, stop, &wg)
	}
	workers := cmp.Or(tc.workers, attackWorkers)
	for range workers * boolInt(tc.one != nil) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tc.one(w, stop)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	var peak atomic.Int64
	sampled := w.sampleRSS(stop, &peak)
	time.Sleep(attackRamp)

	allow, tookAllow := k.hookAnswer("policy.allowed.test", hookAllowPath)
	switch {
	case tc.slots && !tc.contested && allow != "allow":
		t.Errorf("hook call to the live endpoint with every slot held: %s, want the endpoint's allow", allow)
	case allow != "allow" && allow != "deny":
		t.Errorf("hook call to the live endpoint under the attack: %s, want the endpoint's allow or egressd's deny", allow)
	}
	deny, tookDeny := k.hookAnswer("down.allowed.test", "/pre")
	if deny != "deny" {
		t.Errorf("hook call to the endpoint that is down: %s, want egressd's deny", deny)
	}
	if tc.slots && !tc.contested { // a contested attack's connections end at the hook deadline
		// A 200 is possible too: an attacking connection still waiting for its
		// client (a ClientHello not yet sent) yields its slot (share.go).
		resp := k.get("http://allowed.test/during-attack")
		resp.Body.Close()
		if reason := resp.Header.Get("Egressd-Reason"); resp.StatusCode != http.StatusOK &&
			(resp.StatusCode != http.StatusServiceUnavailable || reason != "overloaded") {
			t.Errorf("ordinary request with every slot held: %d %q, want 503 overloaded", resp.StatusCode, reason)
		}
	}
	stopAttack()
	<-sampled
	served := k.servedAgain()
	time.Sleep(time.Second)
	after := w.rss(t)
	if p, limit := peak.Load(), rssLimit(); p-idle > limit {
		t.Errorf("RSS peaked at %d MiB under the attack, %d MiB idle: more than %d MiB above", p>>20, idle>>20, limit>>20)
	}
	details := map[string]int{}
	for _, l := range w.egressLines() {
		if d, _ := l["detail"].(string); d != "" {
			details[d]++
		}
	}
	t.Logf("refusal details: %v", details)
	t.Logf("%s: RSS idle %d MiB, peak %d MiB, after %d MiB; hook call: %s in %v, down endpoint: %s in %v; served again after %v",
		tc.name, idle>>20, peak.Load()>>20, after>>20, allow, tookAllow.Round(time.Millisecond), deny,
		tookDeny.Round(time.Millisecond), served.Round(time.Millisecond))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sampleRSS records egressd's largest RSS in peak until stop; the result closes
// when sampling has ended.
func (w *world) sampleRSS(stop <-chan struct{}, peak *atomic.Int64) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if n, err := rssOf(w); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return done
}

// hookAnswer makes one pre-tool hook call to host+path on a new intercepted tunnel
// and returns the decision the runtime got ("allow", "deny", or what went wrong),
// failing the case when it came after the hook's timeout.
func (k *kase) hookAnswer(host, path string) (string, time.Duration) {
	k.t.Helper()
	start := time.Now()
	c := k.intercepted(host)
	defer c.Close()
	k.send(c, "POST "+path+" HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 2\r\n\r\n{}")
	resp := k.response(c, http.MethodPost)
	b := string(k.body(resp))
	took := time.Since(start)
	if took > hookTimeout+raceSlack {
		k.t.Errorf("hook call to %s took %v, past its timeout %v", host, took, hookTimeout)
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		return fmt.Sprintf("status %d %s", resp.StatusCode, b), took
	case strings.Contains(b, `"allow"`):
		return "allow", took
	case strings.Contains(b, `"deny"`) && strings.Contains(b, "(fail-closed)"):
		return "deny", took
	}
	return "unexpected " + b, took
}

// servedAgain waits until an ordinary request is served and returns how long that took.
func (k *kase) servedAgain() time.Duration {
	k.t.Helper()
	start := time.Now()
	for time.Since(start) < 15*time.Second {
		resp, err := k.client().Get("http://allowed.test/after-attack")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	k.t.Fatal("ordinary requests still not served 15 s after the attack stopped")
	return 0
}

// The attack connections. They use no *testing.T: they run on worker goroutines,
// and every failure just ends the connection (the worker opens another).

// attackDial opens a connection to egressd's sandbox listener.
func attackDial(w *world) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", w.ProxyAddr, 2*time.Second)
	if err == nil {
		nc.SetDeadline(time.Now().Add(time.Minute))
	}
	return nc, err
}

// attackTunnel opens a CONNECT tunnel to host:443 and completes TLS in it.
func attackTunnel(w *world, host string) (net.Conn, error) {
	return attackTunnelALPN(w, host, "http/1.1")
}

// attackTunnelALPN is attackTunnel offering the protocol alpn; h2 must be what the
// handshake settles on.
func attackTunnelALPN(w *world, host, alpn string) (*tls.Conn, error) {
	nc, err := attackDial(w)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(nc, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		nc.Close()
		return nil, fmt.Errorf("CONNECT %s: %v", host, err)
	}
	tc := tls.Client(nc, &tls.Config{ServerName: host, RootCAs: w.roots, NextProtos: []string{alpn}})
	if err := tc.Handshake(); err != nil || alpn == "h2" && tc.ConnectionState().NegotiatedProtocol != alpn {
		nc.Close()
		return nil, fmt.Errorf("TLS with ALPN %s to %s: %v (protocol %q)", alpn, host, err, tc.ConnectionState().NegotiatedProtocol)
	}
	return tc, nil
}

// until waits for stop or d, whichever comes first, and reports whether stop came.
func until(stop <-chan struct{}, d time.Duration) bool {
	select {
	case <-stop:
		return true
	case <-time.After(d):
		return false
	}
}

// trickleHookBody poses as the runtime: a hook call whose body comes one byte at a time.
func trickleHookBody(w *world, stop <-chan struct{}) {
	c, err := attackTunnel(w, "policy.allowed.test")
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 1000\r\n\r\n", hookAllowPath)
	for range 1000 {
		if until(stop, 500*time.Millisecond) {
			return
		}
		if _, err := c.Write([]byte("x")); err != nil {
			return
		}
	}
}

// pipelineNeverRead sends requests for large answers and reads none of them.
func pipelineNeverRead(w *world, stop <-chan struct{}) {
	c, err := attackDial(w)
	if err != nil {
		return
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096) // the answers back up into egressd at once
	for range 2 {
		fmt.Fprintf(c, "GET http://allowed.test%s HTTP/1.1\r\nHost: allowed.test\r\n\r\n", bigPath)
	}
	<-stop
}

// slowUpload sends a body to an allowlisted host one byte every 2 s, within
// limits.read_header per read.
func slowUpload(w *world, stop <-chan struct{}) {
	c, err := attackDial(w)
	if err != nil {
		return
	}
	defer c.Close()
	io.WriteString(c, "POST http://allowed.test/upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 100000\r\n\r\n")
	for range 1000 {
		if until(stop, 2*time.Second) {
			return
		}
		if _, err := c.Write([]byte("x")); err != nil {
			return
		}
	}
}

// heldTunnel opens a tunnel to an allowlisted host, completes TLS with it, and
// holds it idle.
func heldTunnel(w *world, stop <-chan struct{}) {
	c, err := attackTunnel(w, "allowed.test")
	if err != nil {
		return
	}
	defer c.Close()
	<-stop
}

// largeStalledHookBody sends a hook call almost all of a body of
// limits.hook_body_bytes (1 MiB), then stalls until egressd answers.
func largeStalledHookBody(w *world, stop <-chan struct{}) {
	c, err := attackTunnel(w, "policy.allowed.test")
	if err != nil {
		return
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: %d\r\n\r\n", hookAllowPath, 1<<20)
	if _, err := c.Write(make([]byte, 1<<20-1)); err != nil {
		return
	}
	waitClosed(c, stop)
	until(stop, 500*time.Millisecond)
}

// waitClosed reads c until egressd closes it or stop.
func waitClosed(c net.Conn, stop <-chan struct{}) {
	buf := make([]byte, 4096)
	for {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(buf)
		if err != nil && !isTimeout(err) {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// h2StalledStreams opens one intercepted HTTP/2 connection to the hook host and
// keeps h2Streams hook calls on it, each sending almost 1 MiB of body and stalling.
func h2StalledStreams(k *kase, stop <-chan struct{}, wg *sync.WaitGroup) {
	cc := k.h2("policy.allowed.test:443")
	for range h2Streams {
		wg.Go(func() {
			for !until(stop, 10*time.Millisecond) {
				pr, pw := io.Pipe()
				go func() {
					pw.Write(make([]byte, 1<<20-1))
					<-stop
					pw.Close()
				}()
				req, _ := http.NewRequest(http.MethodPost, "https://policy.allowed.test"+hookAllowPath, pr)
				req.ContentLength = 1 << 20
				resp, err := cc.RoundTrip(req)
				pr.CloseWithError(io.ErrClosedPipe)
				if err != nil {
					if until(stop, 100*time.Millisecond) {
						return
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// h2Streams is how many streams the HTTP/2 attack keeps open on its one connection.
const h2Streams = 200

// rssOf is egressd's RSS, for goroutines (no *testing.T).
func rssOf(w *world) (int64, error) { return procfs.RSS(w.ServingPid()) }

// idleTunnels is how many idle tunnels are open when TestSIGTERMWithIdleTunnels
// sends SIGTERM.
const idleTunnels = 1000

// TestSIGTERMWithIdleTunnels: with idleTunnels spliced tunnels open and idle,
// SIGTERM makes egressd stop accepting, close them (they have no end to wait for)
// and exit 0 well within limits.drain (10 s), with every tunnel's log line written.
func TestSIGTERMWithIdleTunnels(t *testing.T) {
	w := newWorld(t, config{})
	k := w.begin(t)
	hello := clientHelloBytes(t, "allowed.test")
	var tunnels []net.Conn
	t.Cleanup(func() {
		for _, c := range tunnels {
			c.Close()
		}
	})
	for range idleTunnels {
		c := k.connect("allowed.test:443")
		k.send(c, string(hello)) // the upstream answers; nobody ever finishes the handshake
		tunnels = append(tunnels, c)
	}
	for deadline := time.Now().Add(30 * time.Second); w.tunnelsActive(t) < idleTunnels; sleepTick() {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d tunnels active", w.tunnelsActive(t), idleTunnels)
		}
	}
	start := time.Now()
	w.SignalNow(syscall.SIGTERM)
	code, err := w.Wait(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if code != 0 {
		t.Errorf("exit after SIGTERM: %d, want 0", code)
	}
	if took > 10*time.Second {
		t.Errorf("exit %v after SIGTERM with idle tunnels, past limits.drain (10 s)", took)
	}
	logged := 0
	for _, l := range w.egressLines() {
		if l["scheme"] == "connect" && l["host"] == "allowed.test" {
			logged++
		}
	}
	if logged < idleTunnels {
		t.Errorf("%d of %d tunnels logged before exit", logged, idleTunnels)
	}
	t.Logf("SIGTERM with %d idle tunnels: exit 0 after %v, %d tunnel lines logged", idleTunnels, took.Round(time.Millisecond), logged)
}

// clientHelloBytes is a TLS ClientHello for sni, as a client would send it first.
func clientHelloBytes(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go tls.Client(a, &tls.Config{ServerName: sni}).Handshake()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64<<10)
	n, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	return buf[:n]
}

// tunnelsActive reads egressd_tunnels_active from the admin listener.
func (w *world) tunnelsActive(t *testing.T) int {
	t.Helper()
	_, body, err := w.adminGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "egressd_tunnels_active "); ok {
			var n float64
			fmt.Sscan(v, &n)
			return int(n)
		}
	}
	return 0
}
