package conformance_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/load"
)

// envIdleTunnels is how many tunnels TestIdleTunnelsMemory holds; make bench-idle
// sets it (IDLE_TUNNELS, 10,000 by default). Unset, the test is skipped: it is a
// measurement, and under -race the test's own side of 10,000 TLS handshakes takes
// minutes.
const envIdleTunnels = "EGRESSD_IDLE_TUNNELS"

// The goal (docs/performance.md): 10,000 idle CONNECT tunnels in at most 250 MiB
// of egressd's resident set.
const (
	idleGoalTunnels = 10000
	idleGoalBytes   = 250 << 20
	idleOpenAtOnce  = 64
	idleHold        = 2 * time.Second  // after the last opens, before measuring
	idleDrain       = 10 * time.Second // for egressd_tunnels_active to reach 0
	// fdsPerTunnel: this process holds the client's end and the upstream's
	// accepted one, egressd its two (its relay holds no pipe while idle).
	fdsPerTunnel = 2
	fdSlack      = 512
	// idleMemoryLimit is limits.memory: at auto's 64 MiB budget (docs/configuration.md#memory)
	// about 2,700 idle connections fit.
	idleMemoryLimit = "2GiB"
)

// TestIdleTunnelsMemory measures what an idle CONNECT tunnel costs egressd (make
// bench-idle): n spliced tunnels to allowed.test:443, each with a TLS handshake
// and one GET through it (the upstream closes a connection that sent no request,
// never an idle keep-alive one), held idle. It reports egressd's RSS, goroutines
// and fds per tunnel, and fails unless every tunnel opened and was logged,
// egressd_tunnels_active counted them and returned to 0 once they closed, and
// 10,000 tunnels fit in the goal (extrapolated from fewer). The egressd measured
// is a build without -race (config.load), as deployments run it.
func TestIdleTunnelsMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(envIdleTunnels))
	if n <= 0 {
		t.Skipf("a measurement: %s=N (make bench-idle) runs it", envIdleTunnels)
	}
	n = fitFDLimit(t, n)
	// Neither bound may refuse a tunnel: the test measures what tunnels cost,
	// not the bounds that keep a deployment's count below its memory.
	lim := &egressdtest.Limits{MaxConnections: n + fdSlack, Memory: idleMemoryLimit}
	w := newWorld(t, config{load: true, limits: lim})
	k := w.begin(t)
	before := idleFigures(t, w)
	start := time.Now()
	clients, failures := k.openIdleTunnels(n)
	opened := time.Since(start)
	closeAll := sync.OnceFunc(func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	})
	defer closeAll()
	if len(failures) > 0 {
		t.Errorf("%d of %d tunnels failed to open: %v", n-len(clients), n, failures)
	}
	time.Sleep(idleHold)
	idle := idleFigures(t, w)
	if idle.tunnels != len(clients) {
		t.Errorf("egressd_tunnels_active is %d with %d tunnels open and idle", idle.tunnels, len(clients))
	}
	closed := time.Now()
	closeAll()
	drained := w.waitTunnelsZero(t)
	after := w.rss(t)
	logged := 0
	for _, l := range w.egressLines() {
		if l["scheme"] == "connect" && l["host"] == "allowed.test" && l["decision"] == "allow" {
			logged++
		}
	}
	if logged != len(clients) {
		t.Errorf("egressd logged %d allowed tunnels for %d opened", logged, len(clients))
	}
	reportIdle(t, len(clients), opened, before, idle, after, time.Since(closed), drained)
}

// fitFDLimit is how many of n tunnels fit in this process's fd limit, which
// egressd inherits: raising it is make bench-idle's, and takes root; fewer
// tunnels are measured, and the goal extrapolated, when it could not.
func fitFDLimit(t *testing.T, n int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if fit := (int(lim.Cur) - fdSlack) / fdsPerTunnel; fit < n {
		t.Logf("%d tunnels, not %d: RLIMIT_NOFILE is %d, %d per tunnel in this process and in egressd", fit, n, lim.Cur, fdsPerTunnel)
		return fit
	}
	return n
}

// openIdleTunnels opens n tunnels, idleOpenAtOnce at a time, each a client of
// its own whose one connection stays open; it returns those that opened and the
// failures grouped by kind (load.ErrorKind: ports masked).
func (k *kase) openIdleTunnels(n int) ([]*http.Client, map[string]int) {
	var (
		mu       sync.Mutex
		clients  []*http.Client
		failures = map[string]int{}
		next     = make(chan struct{}, n)
		wg       sync.WaitGroup
	)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range min(idleOpenAtOnce, n) {
		wg.Go(func() {
			for range next {
				c := k.client()
				err := getOnce(c, "https://allowed.test/")
				mu.Lock()
				if err != nil {
					failures[load.ErrorKind(err.Error())]++
				} else {
					clients = append(clients, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return clients, failures
}

// getOnce GETs url with c and reads the whole answer, leaving its connection idle.
func getOnce(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// idleState is what egressd holds at one moment.
type idleState struct {
	rss                      int64
	goroutines, fds, tunnels int
}

func idleFigures(t *testing.T, w *world) idleState {
	return idleState{rss: w.rss(t), goroutines: int(w.MetricT(t, "go_goroutines")), fds: w.fds(t), tunnels: w.tunnelsActive(t)}
}

// waitTunnelsZero waits up to idleDrain for egressd_tunnels_active to reach 0 and
// reports whether it did.
func (w *world) waitTunnelsZero(t *testing.T) bool {
	for deadline := time.Now().Add(idleDrain); time.Now().Before(deadline); sleepTick() {
		if w.tunnelsActive(t) == 0 {
			return true
		}
	}
	t.Errorf("egressd_tunnels_active still %d %s after every tunnel closed", w.tunnelsActive(t), idleDrain)
	return false
}

// reportIdle logs the figures and holds them to the goal.
func reportIdle(t *testing.T, n int, opened time.Duration, before, idle idleState, after int64, toZero time.Duration, drained bool) {
	if n == 0 {
		t.Fatal("no tunnel opened")
	}
	per := func(a, b int) float64 { return float64(b-a) / float64(n) }
	perTunnel := float64(idle.rss-before.rss) / float64(n)
	t.Logf("%d idle tunnels, opened in %.2fs (%d at a time): egressd RSS %.1f MiB before, %.1f MiB idle, %.1f MiB after closing; per tunnel %.1f KiB, %.1f goroutines, %.1f fds",
		n, opened.Seconds(), idleOpenAtOnce, mib(before.rss), mib(idle.rss), mib(after), perTunnel/1024,
		per(before.goroutines, idle.goroutines), per(before.fds, idle.fds))
	if drained {
		t.Logf("egressd_tunnels_active back to 0 %.2fs after closing began", toZero.Seconds())
	}
	at10k := float64(before.rss) + idleGoalTunnels*perTunnel
	if n >= idleGoalTunnels {
		at10k = float64(idle.rss)
	}
	t.Logf("goal: %d idle tunnels ≤ %.0f MiB of egressd RSS: %.1f MiB (extrapolated when fewer than %d opened)", idleGoalTunnels, mib(idleGoalBytes), mib(int64(at10k)), idleGoalTunnels)
	if at10k > idleGoalBytes {
		t.Errorf("goal not met: %d idle tunnels would take %.1f MiB of egressd RSS", idleGoalTunnels, mib(int64(at10k)))
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
