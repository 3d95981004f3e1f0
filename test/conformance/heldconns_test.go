package conformance_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// TestHeldInterceptedRequests: the sandbox holds thousands of intercepted
// requests open (CONNECT to an intercepted host, TLS, a POST declaring
// heldBodyLength bytes and sending one), at egressd's default limits
// (limits.max_connections 10000) inside a memory cgroup of the shipped limit,
// while the runtime makes pre-tool hook calls through the hooks listener. Each
// held request costs egressd its connection, its TLS and the upstream request
// it forwards; counted nowhere, a few thousand got egressd OOM-killed, and the
// calls in flight were cut (read as "allow"). Every connection draws on the
// memory budget, so:
//   - egressd is never OOM-killed, and its RSS stays within rssLimit of idle
//     plus the budget;
//   - every hook call gets the endpoint's allow or egressd's deny, in time;
//   - the attackers beyond the budget get 503 overloaded (detail memory_conns),
//     on their CONNECT or their POST.
func TestHeldInterceptedRequests(t *testing.T) {
	cg := newMemoryCgroup(t, shippedMemory)
	w := hooksWorld(t, config{wrap: cg.wrap(), limits: raceLimits(), hooksListener: true})
	checkMemoryLimits(t, w)
	w.begin(t)
	a := startCgroupAttack(t, w, cg)
	for i := range heldRequests {
		a.wg.Go(func() {
			if !until(a.stop, time.Duration(i)*heldRamp/time.Duration(heldRequests)) {
				a.tally.add(holdRequest(w, a.stop))
			}
		})
	}
	calls := runtimeCalls(w, w.Addrs["hooks"], a.stop, &a.wg)
	time.Sleep(heldAttackTime)
	a.alive(t)
	budget := shippedMemory / 4
	if egressdtest.RaceEnabled {
		budget = 16 << 20
	}
	a.end(t, budget+rssLimit())
	idle, peak, tally := a.idle, &a.peak, a.tally
	answered := map[string]int{}
	outcomes, took := calls.finish()
	for _, c := range outcomes {
		answered[c]++
	}
	for outcome, n := range answered {
		if outcome != "allow" && outcome != "deny" {
			t.Errorf("%d hook calls through the hooks listener got %s, want the endpoint's allow or egressd's deny", n, outcome)
		}
	}
	if answered["allow"]+answered["deny"] < 5 {
		t.Errorf("only %v hook calls made during the attack", answered)
	}
	details := refusalDetails(w)
	if details["memory_conns"] == 0 || !strings.Contains(tally.String(), "503 overloaded") {
		t.Errorf("no attacker refused overloaded/memory_conns: the budget never refused the held requests (attack: %s; details %v)", tally, details)
	}
	slices.Sort(took)
	t.Logf("cgroup limit %d MiB; RSS idle %d MiB, peak %d MiB (cgroup peak %d MiB); %d held requests: %s; refusal details %v; hook calls: %v, p50 %v, max %v",
		shippedMemory>>20, idle>>20, peak.Load()>>20, cg.peak()>>20, heldRequests, tally, details, answered,
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

// heldRequests is how many held requests the attack opens (fewer in a race
// build: see shippedMemory), evenly over heldRamp (all at once, their TLS
// handshakes are a CPU attack of their own, which on a small machine starves
// the runtime's calls whatever egressd does); heldAttackTime is how long it
// holds them.
var heldRequests = 4000 - 3000*boolInt(egressdtest.RaceEnabled)

const (
	heldRamp       = 8 * time.Second
	heldAttackTime = 25 * time.Second
)

// holdRequest opens one held intercepted request and holds it until stop or until
// egressd ends it, returning what it got: "held", the refusal's status and reason,
// or what went wrong.
func holdRequest(w *world, stop <-chan struct{}) string {
	nc, err := net.DialTimeout("tcp", w.ProxyAddr, 10*time.Second)
	if err != nil {
		return "dial failed"
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(heldAttackTime + 30*time.Second))
	const host = "api.allowed.test"
	fmt.Fprintf(nc, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "CONNECT: no answer"
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}
	tc := tls.Client(nc, &tls.Config{ServerName: host, RootCAs: w.roots, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return "TLS failed"
	}
	fmt.Fprintf(tc, "POST /held HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\nx", host, heldBodyLength)
	answer := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(tc), &http.Request{Method: http.MethodPost})
		if err != nil {
			answer <- "closed"
			return
		}
		answer <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}()
	select {
	case a := <-answer:
		return a
	case <-stop:
		return "held"
	}
}

// callLoop is the runtime's pre-tool hook calls, one after another until stop.
type callLoop struct {
	mu       sync.Mutex
	outcomes []string
	took     []time.Duration
	done     chan struct{}
}

// runtimeCalls makes pre-tool hook calls to the endpoint that allows through
// addr, one after another, until stop.
func runtimeCalls(w *world, addr string, stop <-chan struct{}, wg *sync.WaitGroup) *callLoop {
	l := &callLoop{done: make(chan struct{})}
	wg.Go(func() {
		defer close(l.done)
		begun := time.Now()
		for !until(stop, 200*time.Millisecond) {
			start := time.Now()
			o := runtimeCall(w, addr)
			if o != "allow" && o != "deny" {
				o = fmt.Sprintf("%s (begun %v into the attack)", o, start.Sub(begun).Round(100*time.Millisecond))
			}
			l.mu.Lock()
			l.outcomes, l.took = append(l.outcomes, o), append(l.took, time.Since(start))
			l.mu.Unlock()
		}
	})
	return l
}

// finish waits for the loop to end (stop) and returns every call's outcome and
// how long it took.
func (l *callLoop) finish() ([]string, []time.Duration) {
	<-l.done
	return l.outcomes, l.took
}

// runtimeCall is one pre-tool hook call through addr within the hook's timeout:
// "allow", "deny" (egressd's fail-closed deny), or what went wrong.
func runtimeCall(w *world, addr string) string {
	start := time.Now()
	nc, err := net.DialTimeout("tcp", addr, hookTimeout)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer nc.Close()
	nc.SetDeadline(start.Add(hookTimeout + raceSlack))
	got := hookExchange(w, nc)
	if strings.Contains(got, `"deny"`) && strings.Contains(got, "(fail-closed)") {
		got = "deny"
	}
	if took := time.Since(start); took > hookTimeout+raceSlack {
		return fmt.Sprintf("%s after %v, past the timeout", got, took.Round(time.Millisecond))
	}
	return got
}
