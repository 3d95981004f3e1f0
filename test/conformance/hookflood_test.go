package conformance_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/hookflood"
	"github.com/egressd/egressd/internal/testutil/load"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The fake-call flood (internal/testutil/hookflood): the sandbox poses as the
// runtime as fast as it can, each fake pre-tool call a new connection (CONNECT to
// the hook host, TLS, a POST whose body never ends), while spliced tunnels hold
// every connection slot. The runtime reads a call that fails in transport (a
// reset, a close, a 503) as "allow", so every real call must get the endpoint's
// answer or egressd's deny. The flood runs in a child process, bounded in rate,
// time and connections.
const (
	floodCallRate = 1000 // fake calls begun per second
	floodCallsFor = 5 * time.Second
	floodSlots    = 64 // limits.max_connections, all held by spliced tunnels
	floodRuns     = 5  // runs of the url-identified flood
	// floodCallGap spaces the real calls, as tool calls are.
	floodCallGap = 100 * time.Millisecond
)

// The flood scenarios measure egressd under load. A race build of egressd, or
// of the flood, cannot make a thousand TLS handshakes a second on a small
// machine, so a race build of the suite runs them on builds without -race, made
// by TestMain before it enters the namespace and named in these variables
// (data races are the other scenarios' to find).
const (
	envLoadEgressd = "EGRESSD_CONFORMANCE_LOAD_BIN"
	envLoadFlood   = "EGRESSD_CONFORMANCE_FLOOD_BIN"
)

// buildLoadBinaries builds egressd (unless envBinary names one) and the flood
// without -race, in a race build of the suite, and returns the function that
// removes them.
func buildLoadBinaries() (cleanup func(), err error) {
	if !egressdtest.RaceEnabled || os.Getenv(envLoadFlood) != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "conformance-load-")
	if err != nil {
		return nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bins := map[string]string{envLoadFlood: "github.com/egressd/egressd/internal/testutil/hookflood/cmd/hookflood"}
	if os.Getenv(envBinary) == "" {
		bins[envLoadEgressd] = "github.com/egressd/egressd/cmd/egressd"
	}
	for env, pkg := range bins {
		bin := filepath.Join(dir, filepath.Base(pkg))
		if err := egressdtest.BuildPackage(pkg, bin, egressdtest.BuildOptions{}); err != nil {
			cleanup()
			return nil, err
		}
		os.Setenv(env, bin)
	}
	return cleanup, nil
}

// TestHookUnderCallFlood: with a hooks listener, the flood reaches only the sandbox
// listener and every real call (on the hooks listener) gets the endpoint's allow;
// with hooks.identify: url, fake and real calls share the sandbox listener and its
// hook lane, and every real call gets the endpoint's allow or egressd's deny, over
// floodRuns runs: never a transport error.
func TestHookUnderCallFlood(t *testing.T) {
	slots := &egressdtest.Limits{MaxConnections: floodSlots}
	t.Run("hooks listener", func(t *testing.T) {
		w := hooksWorld(t, config{limits: slots, hooksListener: true, load: true})
		for _, o := range runCallFlood(t, w, w.Addrs["hooks"]) {
			if o != hookflood.Allow {
				t.Errorf("real call on the hooks listener during the flood: %s, want the endpoint's allow", o)
			}
		}
	})
	t.Run("identify url", func(t *testing.T) {
		for run := range floodRuns {
			t.Run(fmt.Sprint(run), func(t *testing.T) {
				w := hooksWorld(t, config{limits: slots, identify: "url", load: true})
				for _, o := range runCallFlood(t, w, w.ProxyAddr) {
					if o != hookflood.Allow && o != hookflood.Deny {
						t.Errorf("real call during the flood: %s, want the endpoint's allow or egressd's deny", o)
					}
				}
			})
		}
	})
}

// runCallFlood holds every slot of the sandbox listener with spliced tunnels, runs
// the flood at it and makes real calls at realAddr one after another while it
// runs, and returns what they got. It fails the test when the flood fell short
// of floodCallRate or a real call came after its timeout.
func runCallFlood(t *testing.T, w *world, realAddr string) []string {
	k := w.begin(t)
	holdSlots(k, floodSlots)
	idle, cpu0 := w.rss(t), w.cpu(t)
	stop := make(chan struct{})
	var peak atomic.Int64
	sampled := w.sampleRSS(stop, &peak)
	fl, err := hookflood.Start(os.Getenv(envLoadFlood), hookflood.Options{Proxy: w.ProxyAddr, Host: "policy.allowed.test", Path: hookAllowPath,
		Rate: floodCallRate, For: floodCallsFor, Hold: 3 * time.Second, MaxOpen: 8000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fl.Stop(); fl.Wait() })
	time.Sleep(time.Second) // the flood is under way
	var outcomes []string
	var took load.Latencies
	for end := time.Now().Add(floodCallsFor - 1500*time.Millisecond); time.Now().Before(end); time.Sleep(floodCallGap) {
		o, d := hookCaller(realAddr, w).Call(hookTimeout + raceSlack + 5*time.Second)
		outcomes = append(outcomes, o)
		took.Record(d)
		if d > hookTimeout+raceSlack {
			t.Errorf("real call took %v, past its timeout %v", d, hookTimeout)
		}
	}
	st, err := fl.Wait()
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-sampled
	cpu := w.cpu(t) - cpu0
	counts := map[string]int{}
	for _, o := range outcomes {
		counts[o]++
	}
	t.Logf("flood: %.0f fake calls/s begun, %.0f/s reached their POST, %d open at most; %d real calls: %v; p50 %v, p99 %v; "+
		"egressd: %.2f CPU-s per second, RSS idle %d MiB, peak %d MiB",
		st.Rate(), st.PostRate(), st.PeakOpen, len(outcomes), counts,
		took.Quantile(0.5).Round(time.Millisecond), took.Quantile(0.99).Round(time.Millisecond),
		cpu.Seconds()/st.Seconds, idle>>20, peak.Load()>>20)
	if p := peak.Load(); p-idle > rssLimit() {
		t.Errorf("RSS peaked at %d MiB under the flood, %d MiB idle: more than %d MiB above", p>>20, idle>>20, rssLimit()>>20)
	}
	if !floodSaturated(st) {
		t.Errorf("the flood began %.0f fake calls a second, %.0f reaching their POST: want %d, or at least %d times what egressd took",
			st.Rate(), st.PostRate(), floodCallRate, floodOutran)
	}
	return outcomes
}

// floodOutran is how many times the fake calls egressd took (those that reached
// their POST) a flood short of floodCallRate must have begun.
const floodOutran = 2

// floodSaturated reports whether the flood was one: it began floodCallRate fake
// calls a second, or, on a machine too loaded for the flood's process to reach
// that, still began at least floodOutran times as many as egressd could take
// (the rest waited in its backlog or were cut): what the real calls met was all
// egressd had, however fast the machine.
func floodSaturated(st hookflood.Stats) bool {
	return st.Rate() >= floodCallRate*0.95 || st.Begun > 0 && st.Begun >= floodOutran*st.Posted
}

// hookCaller makes the runtime's calls to the endpoint that allows, at proxy.
func hookCaller(proxy string, w *world) hookflood.Caller {
	return hookflood.Caller{Proxy: proxy, Host: "policy.allowed.test", Path: hookAllowPath, Roots: w.roots}
}

// holdSlots fills n connection slots with spliced tunnels, TLS done with the
// upstream, then idle: serving connections, never evicted.
func holdSlots(k *kase, n int) {
	k.t.Helper()
	for range n {
		c := k.connect("allowed.test:443")
		if _, err := k.tlsOver(c, "allowed.test", "http/1.1"); err != nil {
			k.t.Fatalf("holding a slot: %v", err)
		}
	}
}

// TestHookDeclaredLengthFlood: forty fake hook calls, each declaring a body of
// almost limits.hook_body_bytes (1 MiB) and sending one byte, leave the 32 MiB
// hook budget to real calls: each gets the endpoint's allow. Reserved by declared
// length, they held the whole budget, and every real call got the deny until they
// closed (renewable every hook deadline).
func TestHookDeclaredLengthFlood(t *testing.T) {
	w := hooksWorld(t, config{})
	k := w.begin(t)
	for range 40 {
		c := k.intercepted("policy.allowed.test")
		k.send(c, "POST "+hookAllowPath+" HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 1048575\r\n\r\nx")
	}
	time.Sleep(300 * time.Millisecond) // egressd has read their heads and their byte
	for i := range 5 {
		if o, took := hookCaller(w.ProxyAddr, w).Call(hookTimeout); o != hookflood.Allow {
			t.Errorf("real call %d beside 40 calls declaring 1 MiB: %s after %v, want the endpoint's allow", i, o, took)
		}
	}
}

// cpu is egressd's CPU time so far.
func (w *world) cpu(t *testing.T) time.Duration {
	t.Helper()
	d, err := procfs.CPU(w.Pid())
	if err != nil {
		t.Fatal(err)
	}
	return d
}
