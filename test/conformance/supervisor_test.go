package conformance_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The runtime treats a hook call that fails ("connection refused", a reset) as
// "allow": egressd must never be absent from its ports. `egressd run` is a parent
// that holds the listening sockets and a worker that serves them
// (docs/configuration.md, "Process model"). These cases kill the worker, and
// upgrade it, while runtimes make pre-tool hook calls in a loop.

// hookClients is how many runtimes make hook calls in a loop.
const hookClients = 4

// workerKills is how often TestWorkerKilledUnderHookLoad kills the worker; each
// worker serves workerLife first (past the supervisor's 1 s, so every restart is
// immediate: the back-off is for workers that die young).
const (
	workerKills = 10
	workerLife  = 1500 * time.Millisecond
)

// call is one hook call: when it started and ended, and what it got.
type call struct {
	start, end time.Time
	answer     string // "allow", or what went wrong
	refused    bool   // the connection itself was refused
}

// hookLoad makes hook calls to the endpoint that allows, from hookClients
// goroutines, each on a new connection and intercepted tunnel, until stop.
type hookLoad struct {
	w     *world
	mu    sync.Mutex
	calls []call
	wg    sync.WaitGroup
	stop  chan struct{}
}

func startHookLoad(w *world) *hookLoad {
	h := &hookLoad{w: w, stop: make(chan struct{})}
	for range hookClients {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for {
				select {
				case <-h.stop:
					return
				default:
				}
				c := hookCall(w)
				h.mu.Lock()
				h.calls = append(h.calls, c)
				h.mu.Unlock()
			}
		}()
	}
	return h
}

// finish stops the load and returns every call.
func (h *hookLoad) finish() []call {
	close(h.stop)
	h.wg.Wait()
	return h.calls
}

// hookCall makes one pre-tool hook call, bounded by the hook's timeout (plus
// the race build's slack): it is answered, or records what went wrong.
func hookCall(w *world) call {
	c := call{start: time.Now()}
	defer func() { c.end = time.Now() }()
	nc, err := net.DialTimeout("tcp", w.ProxyAddr, hookTimeout)
	if err != nil {
		c.refused = errors.Is(err, syscall.ECONNREFUSED)
		c.answer, c.end = "dial: "+err.Error(), time.Now()
		return c
	}
	defer nc.Close()
	nc.SetDeadline(c.start.Add(hookTimeout + raceSlack))
	c.answer = hookExchange(w, nc)
	c.end = time.Now()
	return c
}

// hookExchange is a hook call on nc: CONNECT to the hook host, TLS with egressd's
// leaf, the POST; it returns "allow" or what went wrong.
func hookExchange(w *world, nc net.Conn) string {
	const host = "policy.allowed.test"
	fmt.Fprintf(nc, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", host, host)
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "CONNECT: " + err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("CONNECT: %d", resp.StatusCode)
	}
	tc := tls.Client(nc, &tls.Config{ServerName: host, RootCAs: w.roots, NextProtos: []string{"http/1.1"}})
	fmt.Fprintf(tc, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", hookAllowPath, host)
	resp, err = http.ReadResponse(bufio.NewReader(tc), &http.Request{Method: http.MethodPost})
	if err != nil {
		return "hook call: " + err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	if resp.StatusCode != http.StatusOK || !strings.Contains(b.String(), `"allow"`) {
		return fmt.Sprintf("hook call: %d %s", resp.StatusCode, b.String())
	}
	return "allow"
}

// inFlightAt reports whether c was in flight at one of the instants.
func (c call) inFlightAt(instants []time.Time) bool {
	return slices.ContainsFunc(instants, func(at time.Time) bool { return c.start.Before(at) && c.end.After(at) })
}

// TestWorkerKilledUnderHookLoad: the worker is killed with SIGKILL workerKills
// times while runtimes make hook calls in a loop. No connection is ever refused;
// every call is answered with the endpoint's allow within its timeout, except
// those the killed worker was serving at the instant it was killed (their socket
// dies with the process that holds it: no supervisor can answer them, and the
// runtime would see a reset, as with any process killed from outside; egressd
// never causes that kill itself: the memory budget holds what a client can make
// it hold, TestHeldInterceptedRequests). Calls that arrive while no worker runs
// wait in the backlog and are answered: the longest such wait is the restart gap.
func TestWorkerKilledUnderHookLoad(t *testing.T) {
	w := hooksWorld(t, config{})
	k := w.begin(t)
	load := startHookLoad(w)
	var kills []time.Time
	var restarts []time.Duration
	pid, since := w.ServingPid(), time.Now()
	for range workerKills {
		time.Sleep(time.Until(since.Add(workerLife)))
		kills = append(kills, time.Now())
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			load.finish()
			t.Fatalf("kill worker %d: %v", pid, err)
		}
		old := pid
		if pid, since = w.nextWorker(old); pid == 0 {
			refused := 0
			for _, c := range load.finish() {
				refused += boolInt(c.refused)
			}
			t.Fatalf("no worker served within %v of killing %d; %d hook calls were refused meanwhile", startTimeout, old, refused)
		}
		restarts = append(restarts, since.Sub(kills[len(kills)-1]))
	}
	time.Sleep(workerLife)
	calls := load.finish()

	var answered, cut int
	var gap time.Duration // the longest an answered call that began during a restart took
	for _, c := range calls {
		switch {
		case c.refused:
			t.Errorf("a hook call's connection was refused at %v: %s", c.start.Format(time.StampMilli), c.answer)
		case c.answer == "allow":
			answered++
			if took := c.end.Sub(c.start); took > hookTimeout+raceSlack {
				t.Errorf("a hook call took %v, past its timeout %v", took, hookTimeout)
			}
			if duringRestart(c.start, kills, restarts) {
				gap = max(gap, c.end.Sub(c.start))
			}
		case c.inFlightAt(kills):
			cut++
		default:
			t.Errorf("a hook call (%v to %v) that no kill interrupted got %q", c.start.Format(time.StampMilli), c.end.Format(time.StampMilli), c.answer)
		}
	}
	if cut > hookClients*workerKills {
		t.Errorf("%d calls cut, more than were in flight at the kills", cut)
	}
	if n := w.restartLines(t); n != workerKills {
		t.Errorf("%d restart lines for %d kills", n, workerKills)
	}
	k.servedAgain()
	t.Logf("%d kills under %d looping runtimes: %d calls, %d answered, 0 refused, %d cut in flight at a kill; worker restarted (kill to \"egressd started\") in %v; longest answered call begun during a restart %v",
		workerKills, hookClients, len(calls), answered, cut, durations(restarts), gap.Round(time.Millisecond))
}

// TestUpgradeUnderHookLoad: SIGUSR2 while runtimes make hook calls in a loop, with
// the binary replaced on disk first: a worker from the new file takes over once
// ready, and only then does the old one drain and exit; no call is refused or
// left without its answer.
func TestUpgradeUnderHookLoad(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "egressd")
	copyBinary(t, egressdtest.Binary(), bin)
	w := hooksWorld(t, config{bin: bin})
	k := w.begin(t)
	old := w.ServingPid()
	load := startHookLoad(w)
	time.Sleep(time.Second)
	copyBinary(t, egressdtest.Binary(), bin) // a new file at the same path
	upgraded := time.Now()
	if err := w.SignalNow(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	next, _ := w.nextWorker(old)
	if next == 0 {
		load.finish()
		t.Fatalf("no new worker served within %v of SIGUSR2", startTimeout)
	}
	w.WaitLineT(t, "the old worker's exit", func(l egressdtest.Line) bool {
		return l.Message() == "previous worker exited" && l.Num("pid") == float64(old)
	})
	took := time.Since(upgraded)
	time.Sleep(time.Second)
	calls := load.finish()

	for _, c := range calls {
		if c.answer != "allow" {
			t.Errorf("a hook call (%v to %v) during the upgrade got %q (refused: %v)", c.start.Format(time.StampMilli), c.end.Format(time.StampMilli), c.answer, c.refused)
		}
	}
	// The hand-over: the old worker began to drain only once the new one served.
	if served, draining := w.lineIndex(t, "egressd started", float64(next)), w.lineIndex(t, "draining", -1); draining < served {
		t.Errorf("the old worker began to drain (line %d) before the new one served (line %d)", draining, served)
	}
	exe, err1 := os.Stat(fmt.Sprintf("/proc/%d/exe", next))
	file, err2 := os.Stat(bin)
	if err1 != nil || err2 != nil || !os.SameFile(exe, file) {
		t.Errorf("the new worker %d does not run the file now at %s (%v, %v)", next, bin, err1, err2)
	}
	k.servedAgain()
	t.Logf("upgrade under %d looping runtimes: %d calls, all answered, 0 refused; old worker %d replaced by %d and exited %v after SIGUSR2",
		hookClients, len(calls), old, next, took.Round(time.Millisecond))
}

// copyBinary writes a copy of from at to (a new file, renamed into place), as
// an upgrade installs a binary.
func copyBinary(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	tmp := to + ".new"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// nextWorker waits (startTimeout) for a worker other than old to serve (its
// "egressd started" line) and returns its pid and when that was seen; 0 when
// none did.
func (w *world) nextWorker(old int) (int, time.Time) {
	for deadline := time.Now().Add(startTimeout); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if pid := w.ServingPid(); pid != old {
			return pid, time.Now()
		}
	}
	return 0, time.Time{}
}

// lineIndex is the index among the log lines of the first with message msg (and
// "pid" pid, unless pid is -1); it fails t when there is none.
func (w *world) lineIndex(t *testing.T, msg string, pid float64) int {
	t.Helper()
	for i, l := range w.logLines() {
		if l.Message() == msg && (pid == -1 || l.Num("pid") == pid) {
			return i
		}
	}
	t.Fatalf("no %q line (pid %v)", msg, pid)
	return 0
}

// restartLines counts the parent's lines for workers killed by SIGKILL.
func (w *world) restartLines(t *testing.T) int {
	n := 0
	for _, l := range w.logLines() {
		if strings.HasPrefix(l.Message(), "worker exited") && l.Str("status") == "signal: killed" {
			n++
		}
	}
	return n
}

// duringRestart reports whether at falls between a kill and the next worker's start.
func duringRestart(at time.Time, kills []time.Time, restarts []time.Duration) bool {
	for i, k := range kills {
		if !at.Before(k) && at.Before(k.Add(restarts[i])) {
			return true
		}
	}
	return false
}

// durations summarises ds: "min-max (median m)".
func durations(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%v-%v (median %v)", s[0].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond))
}
