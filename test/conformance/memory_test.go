package conformance_test

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The sandbox drives egressd into an OOM kill, to take its place: while egressd is dead every hook call meets "connection refused", which
// the agent runtime reads as allow. Each case starts egressd at its default limits
// inside a memory cgroup of the shipped Kubernetes limit (shippedMemory), runs one
// attack that did get it OOM-killed there for oomAttackTime, and asserts:
//   - egressd is alive, and the cgroup saw no OOM kill;
//   - egressd's RSS peak stays within rssLimit of idle;
//   - meanwhile a pre-tool hook call gets the endpoint's allow or egressd's deny
//     within its timeout, and an ordinary request is served;
//   - afterwards ordinary requests are served.

// shippedMemory is the memory limit of deploy/kubernetes' egressd container. A
// race build of egressd gets four times as much: the race detector's shadow
// memory grows with the heap, and each goroutine costs it far more. The race
// build's budget is therefore set, not auto (raceLimits), and its attacks are
// smaller (heldHeadConns): it is there to find races under the attack, while the
// build an operator runs shows the memory figures.
var shippedMemory = int64(256<<20) * int64(1+3*boolInt(egressdtest.RaceEnabled))

// raceLimits are the limits of a race build's egressd: a budget of 16 MiB, so that
// the smaller attack still meets it.
func raceLimits() *egressdtest.Limits {
	if !egressdtest.RaceEnabled {
		return nil
	}
	return &egressdtest.Limits{Memory: "16MiB"}
}

// Bounds of each attack: how long it runs, and how long before the checks made
// while it runs.
const (
	oomAttackTime = 20 * time.Second
	oomRamp       = 5 * time.Second
)

// oomTally counts what the attack's connections got back, by outcome.
type oomTally struct {
	mu sync.Mutex
	n  map[string]int
}

func (t *oomTally) add(outcome string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[string]int{}
	}
	t.n[outcome]++
}

func (t *oomTally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(t.n)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, t.n[k]))
	}
	return strings.Join(parts, ", ")
}

// oomRoute is one attack and the refusal detail it must meet, if any.
type oomRoute struct {
	name   string
	attack func(w *world, stop <-chan struct{}, tally *oomTally)
	// detail is the refusal the budget must have given the attack ("" for none).
	detail string
	// spends says the attack may spend the whole budget (nothing caps its holder),
	// so an ordinary request during it may be the newest, and refused overloaded.
	spends bool
}

func TestOOMRoutes(t *testing.T) {
	for _, tc := range []oomRoute{
		{"request heads held open", heldHeads, "memory_heads", false},
		{"HTTP/2 client that reads nothing", h2ReadsNothing, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) { runOOMRoute(t, tc) })
	}
}

func runOOMRoute(t *testing.T, tc oomRoute) {
	cg := newMemoryCgroup(t, shippedMemory)
	w := hooksWorld(t, config{wrap: cg.wrap(), limits: raceLimits()})
	checkMemoryLimits(t, w)
	k := w.begin(t)
	a := startCgroupAttack(t, w, cg)
	start := time.Now()
	a.wg.Go(func() { tc.attack(w, a.stop, a.tally) })
	time.Sleep(oomRamp)
	a.alive(t)
	decision, took := servedDuringAttack(k, tc.spends)
	time.Sleep(time.Until(start.Add(oomAttackTime)))
	a.alive(t)
	a.end(t, rssLimit())
	served := k.servedAgain()
	idle, peak, tally := a.idle, &a.peak, a.tally
	details := refusalDetails(w)
	if tc.detail != "" && details[tc.detail] == 0 {
		t.Errorf("no refusal with detail %s: the memory budget never refused the attack (details: %v)", tc.detail, details)
	}
	t.Logf("cgroup limit %d MiB; RSS idle %d MiB, peak %d MiB (cgroup peak %d MiB); attack: %s; refusal details %v; hook call: %s in %v; served again after %v",
		shippedMemory>>20, idle>>20, peak.Load()>>20, cg.peak()>>20, tally, details, decision, took.Round(time.Millisecond),
		served.Round(time.Millisecond))
}

// checkMemoryLimits asserts egressd's start line on memory: GOMEMLIMIT set to 90%
// of the cgroup's limit (none is set in its environment), and the budget a quarter
// of it (a race build's is set: raceLimits).
func checkMemoryLimits(t *testing.T, w *world) {
	t.Helper()
	for _, l := range w.logLines() {
		if l.Message() != "memory limits" {
			continue
		}
		wantBudget, wantFrom := shippedMemory/4, "cgroup"
		if egressdtest.RaceEnabled {
			wantBudget, wantFrom = 16<<20, "limits.memory"
		}
		if got := int64(l.Num("memory_budget_bytes")); got != wantBudget || l.Str("memory_budget_from") != wantFrom {
			t.Errorf("memory budget %d from %q, want %d from %s", got, l.Str("memory_budget_from"), wantBudget, wantFrom)
		}
		if got, want := int64(l.Num("gomemlimit_bytes")), int64(float64(shippedMemory)*0.9); got != want || l.Str("gomemlimit_from") != "cgroup" {
			t.Errorf("GOMEMLIMIT %d from %q, want %d from the cgroup", got, l.Str("gomemlimit_from"), want)
		}
		return
	}
	t.Error(`no "memory limits" line at start`)
}

// servedDuringAttack makes a pre-tool hook call, which must get the endpoint's
// allow or egressd's deny within its timeout, and an ordinary request, which must
// be served, or, where the attack may spend the whole budget (spends), refused
// overloaded as the newest holder is (docs/configuration.md, limits.memory);
// it returns the hook call's decision and how long it took.
func servedDuringAttack(k *kase, spends bool) (string, time.Duration) {
	k.t.Helper()
	decision, took := k.hookAnswer("policy.allowed.test", hookAllowPath)
	if decision != "allow" && decision != "deny" {
		k.t.Errorf("hook call during the attack: %s, want the endpoint's allow or egressd's deny", decision)
	}
	resp := k.get("http://allowed.test/during-attack")
	resp.Body.Close()
	refused := resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Egressd-Reason") == "overloaded"
	if resp.StatusCode != http.StatusOK && !(spends && refused) {
		k.t.Errorf("ordinary request during the attack: %d %s, want 200 (or, where the attack may spend the budget, 503 overloaded)",
			resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}
	return decision, took
}

// refusalDetails counts egressd's egress lines by detail.
func refusalDetails(w *world) map[string]int {
	details := map[string]int{}
	for _, l := range w.egressLines() {
		if d, _ := l["detail"].(string); d != "" {
			details[d]++
		}
	}
	return details
}

// cgroupAttack is an attack under way on an egressd in a memory cgroup: stop
// ends it, wg waits for its goroutines, tally counts what they got, and
// egressd's RSS is sampled meanwhile (peak, beside idle before it began).
type cgroupAttack struct {
	w       *world
	cg      *memoryCgroup
	stop    chan struct{}
	wg      sync.WaitGroup
	tally   *oomTally
	idle    int64
	peak    atomic.Int64
	sampled <-chan struct{}
	halt    func()
}

func startCgroupAttack(t *testing.T, w *world, cg *memoryCgroup) *cgroupAttack {
	a := &cgroupAttack{w: w, cg: cg, stop: make(chan struct{}), tally: &oomTally{}, idle: w.rss(t)}
	a.sampled = w.sampleRSS(a.stop, &a.peak)
	a.halt = sync.OnceFunc(func() { close(a.stop); a.wg.Wait(); <-a.sampled })
	t.Cleanup(a.halt)
	return a
}

// end stops the attack and fails the test when egressd's RSS peaked more than
// bound above idle, or the cgroup OOM-killed anything.
func (a *cgroupAttack) end(t *testing.T, bound int64) {
	t.Helper()
	a.halt()
	if hwm, err := procfs.PeakRSS(a.w.ServingPid()); err == nil {
		a.peak.Store(max(a.peak.Load(), hwm))
	}
	if p := a.peak.Load(); p-a.idle > bound {
		t.Errorf("RSS peaked at %d MiB under the attack, %d MiB idle: more than %d MiB above", p>>20, a.idle>>20, bound>>20)
	}
	if n := a.cg.ooms(); n > 0 {
		t.Errorf("the cgroup's limit OOM-killed %d processes", n)
	}
}

// alive fails the test at once when egressd has died.
func (a *cgroupAttack) alive(t *testing.T) {
	t.Helper()
	if !a.w.Alive() {
		t.Fatalf("egressd died under the attack (cgroup OOM kills: %d, peak %d MiB; attack: %s)", a.cg.ooms(), a.cg.peak()>>20, a.tally)
	}
}

// heldHeadConns is how many connections heldHeads keeps sending large heads on
// (fewer in a race build: see shippedMemory).
var heldHeadConns = 2000 - 1600*boolInt(egressdtest.RaceEnabled)

// heldHead is a request head of about 63 KiB, within limits.max_header_bytes
// (64 KiB), that never ends: 63 fields of a kilobyte each.
var heldHead = func() string {
	var b strings.Builder
	b.WriteString("GET http://allowed.test/held HTTP/1.1\r\nHost: allowed.test\r\n")
	for i := range 63 {
		fmt.Fprintf(&b, "X-Fill-%02d: %s\r\n", i, strings.Repeat("a", 1000))
	}
	return b.String()
}()

// heldHeads keeps heldHeadConns connections each sending heldHead and waiting,
// within limits.read_header (10 s), reopening each 2 s after egressd ends it: the
// attack is on memory; a flood of new connections is a CPU attack of its own (and
// every refused one moves 63 KiB through loopback), which on a small machine would
// starve the hook call this one measures.
func heldHeads(w *world, stop <-chan struct{}, tally *oomTally) {
	var wg sync.WaitGroup
	for range heldHeadConns {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tally.add(holdHead(w, stop))
				until(stop, 2*time.Second)
			}
		})
	}
	wg.Wait()
}

// holdHead sends heldHead on a new connection and waits for egressd to end it,
// returning what ended it: its refusal's reason and detail, or the close.
func holdHead(w *world, stop <-chan struct{}) string {
	c, err := attackDial(w)
	if err != nil {
		return "dial failed"
	}
	defer c.Close()
	if _, err := io.WriteString(c, heldHead); err != nil {
		return "closed while sending"
	}
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := br.Peek(1); err == nil {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return "unreadable answer"
			}
			resp.Body.Close()
			return fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
		} else if !isTimeout(err) {
			return "closed"
		}
		select {
		case <-stop:
			return "held"
		default:
		}
	}
}

// h2WindowStreams is how many streams h2ReadsNothing opens: the most one connection may
// have open at once.
const h2WindowStreams = 100

// h2ReadsNothing opens one intercepted HTTP/2 connection to api.allowed.test that
// advertises a zero flow-control window, and asks on h2WindowStreams streams for the echo
// upstream's 16 MiB answer: egressd can send none of it, and what the upstream
// sends meanwhile is what egressd holds.
func h2ReadsNothing(w *world, stop <-chan struct{}, tally *oomTally) {
	tc, err := attackTunnelALPN(w, "api.allowed.test", "h2")
	if err != nil {
		tally.add("tunnel failed: " + err.Error())
		return
	}
	defer tc.Close()
	var mu sync.Mutex // the framer's writes
	fr := http2.NewFramer(tc, tc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(tc, http2.ClientPreface)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	go readFramesNoWindow(fr, &mu, tally)
	var hdr strings.Builder
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"},
		{":authority", "api.allowed.test"}, {":path", bigPath}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := range uint32(h2WindowStreams) {
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2*i + 1, BlockFragment: []byte(hdr.String()),
			EndStream: true, EndHeaders: true})
		mu.Unlock()
		if err != nil {
			tally.add("connection ended while opening streams")
			return
		}
	}
	<-stop
}

// readFramesNoWindow reads egressd's frames, acknowledging its settings and
// pings, counting each answer's status and never opening a window.
func readFramesNoWindow(fr *http2.Framer, mu *sync.Mutex, tally *oomTally) {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" {
				tally.add("status " + s)
			}
		}
		mu.Unlock()
	}
}
