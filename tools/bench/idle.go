package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/egressd/egressd/internal/testutil/load"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The idle-tunnels path: what an idle CONNECT tunnel costs egressd. It opens
// -idle-tunnels spliced tunnels to the upstream's TLS port, each with a TLS
// handshake and one GET / through it, holds them idle, reads egressd's VmRSS,
// goroutines, fds and egressd_tunnels_active, then closes them all and waits
// for egressd_tunnels_active to return to 0. The GET is there because the
// upstream closes a TLS connection that sent no request after its
// ReadHeaderTimeout, before the last of 10,000 tunnels is open, but never an
// idle keep-alive one.

const (
	idlePathName        = "idle-tunnels"
	defaultIdleTunnels  = 10000
	maxIdleTunnels      = 20000
	benchMaxConnections = 30000 // above maxIdleTunnels and the clients: the path measures memory, not the limit
	idleOpenConcurrency = 64
	idleTunnelTimeout   = 10 * time.Second  // one tunnel's dial, CONNECT, handshake and GET
	idleOpenTimeout     = 120 * time.Second // all of them: the path fails past it
	idleHold            = 2 * time.Second
	idleDrainTimeout    = 10 * time.Second
	// idleFDLimit: the bench holds 2 fds per tunnel (its end and the
	// upstream's), egressd 2 (its relay holds no pipe while a tunnel is idle).
	idleFDLimit         = 1 << 18
	benchFDsPerTunnel   = 2
	egressdFDsPerTunnel = 2
	fdSlack             = 128 // fds left for everything else
	idleGoalTunnels     = 10000
	idleGoalBytes       = 250 << 20
)

// idleFDSetup is what raising RLIMIT_NOFILE did, for the report.
var idleFDSetup string

// idleResult is the idle-tunnels row. Counts are -1 when they could not be read.
type idleResult struct {
	Requested             int              `json:"requested"`
	Tried                 int              `json:"tried"` // Requested unless the fd limits Cap it
	Cap                   string           `json:"cap,omitempty"`
	Opened                int              `json:"opened"`
	OpenSeconds           float64          `json:"open_s"`
	HoldSeconds           float64          `json:"hold_s"`
	RSSBeforeBytes        int64            `json:"egressd_rss_before_bytes"` // VmRSS, not the peak
	RSSIdleBytes          int64            `json:"egressd_rss_idle_bytes"`
	RSSClosedBytes        int64            `json:"egressd_rss_after_close_bytes"`
	PerTunnelBytes        float64          `json:"egressd_rss_per_tunnel_bytes"` // (idle - before) / opened
	GoroutinesBefore      int64            `json:"egressd_goroutines_before"`
	GoroutinesIdle        int64            `json:"egressd_goroutines_idle"`
	TunnelsActiveIdle     int64            `json:"egressd_tunnels_active_idle"`
	ZeroAfterCloseSeconds float64          `json:"egressd_tunnels_zero_after_close_s"`
	EgressdFDsBefore      int              `json:"egressd_fds_before"`
	EgressdFDsIdle        int              `json:"egressd_fds_idle"`
	BenchFDLimit          uint64           `json:"bench_fd_limit"`
	EgressdFDLimit        uint64           `json:"egressd_fd_limit"`
	FDSetup               string           `json:"fd_setup,omitempty"`
	Problems              []string         `json:"problems,omitempty"` // they fail the report
	ErrorKinds            map[string]int64 `json:"error_kinds,omitempty"`
}

func idlePathSpec() pathSpec {
	return pathSpec{
		name: idlePathName,
		desc: fmt.Sprintf("-idle-tunnels (default %d) CONNECT tunnels to localhost:<tlsport>, spliced, each with a TLS handshake and one GET through it, "+
			"held idle %s: egressd's VmRSS, goroutines and fds with all of them idle; then closed, and egressd_tunnels_active must return to 0", defaultIdleTunnels, idleHold),
		measure: measureIdleTunnels,
	}
}

// prepareIdleTunnels raises RLIMIT_NOFILE (soft and hard) to idleFDLimit when
// the path runs, before egressd starts and inherits it. Without the privilege
// for the hard limit it raises the soft one to the hard one, and the path caps
// its tunnels to what fits.
func prepareIdleTunnels(o options) {
	if !hasPath(o.paths, idlePathName) {
		return
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		idleFDSetup = "getrlimit: " + err.Error()
		return
	}
	want := uint64(idleFDLimit)
	b, _ := os.ReadFile("/proc/sys/fs/nr_open") // the most a hard limit may be
	if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
		want = min(want, n)
	}
	if lim.Cur >= want {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE already %d", lim.Cur)
		return
	}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(lim.Max, want)})
	if err == nil {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE raised from %d (hard %d) to %d", lim.Cur, lim.Max, want)
	} else if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim.Max, Max: lim.Max}); err2 != nil {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE left at %d: raising it failed (%v, then %v)", lim.Cur, err, err2)
	} else {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE could not be raised to %d (%v: raising the hard limit takes CAP_SYS_RESOURCE); soft limit set to the hard one, %d", want, err, lim.Max)
	}
}

// measureIdleTunnels is the idle-tunnels path: one row.
func measureIdleTunnels(ctx context.Context, env pathEnv) ([]pathResult, error) {
	e, pid := env.e, env.e.ServingPid()
	ir := &idleResult{Requested: env.o.idleTunnels, FDSetup: idleFDSetup, GoroutinesBefore: -1, GoroutinesIdle: -1, TunnelsActiveIdle: -1, ZeroAfterCloseSeconds: -1}
	res := pathResult{Path: idlePathName, Description: idlePathSpec().desc, Idle: ir}
	if err := ir.fitLimits(pid); err != nil {
		return nil, err
	}
	if ir.Cap != "" {
		fmt.Fprintf(env.stderr, "bench: %s: %s\n", idlePathName, ir.Cap)
	}
	if err := waitTunnelsZero(ctx, e); err != nil { // earlier paths' tunnels
		ir.Problems = append(ir.Problems, "before opening: "+err.Error())
	}
	var err error
	if ir.RSSBeforeBytes, err = procfs.RSS(pid); err != nil {
		return nil, fmt.Errorf("egressd's VmRSS: %w", err)
	}
	ir.GoroutinesBefore, _ = e.metric("go_goroutines")
	from := e.LogSize()
	fmt.Fprintf(env.stderr, "bench: %s: opening %d tunnels, %d at a time\n", idlePathName, ir.Tried, idleOpenConcurrency)
	t0 := time.Now()
	conns, kinds, err := openIdleTunnels(ctx, e.Proxy, env.w.up, env.o.size, ir.Tried)
	ir.OpenSeconds, ir.Opened = time.Since(t0).Seconds(), len(conns)
	closeAll := sync.OnceFunc(conns.close)
	defer closeAll()
	if err != nil {
		return nil, err
	}
	if failed := ir.Tried - ir.Opened; failed > 0 {
		ir.ErrorKinds = kinds
		ir.Problems = append(ir.Problems, fmt.Sprintf("%d of %d tunnels failed to open", failed, ir.Tried))
	}
	if err := ir.measureIdle(ctx, e); err != nil {
		return nil, err
	}
	t1 := time.Now()
	closeAll()
	if err := waitTunnelsZero(ctx, e); err != nil {
		ir.Problems = append(ir.Problems, "after closing every tunnel: "+err.Error())
	} else {
		ir.ZeroAfterCloseSeconds = time.Since(t1).Seconds() // closing included
	}
	ir.RSSClosedBytes, _ = procfs.RSS(pid)
	if res.Log, err = e.scanLog(from); err != nil {
		return nil, fmt.Errorf("egressd log: %w", err)
	}
	if res.Log.Allowed200 != int64(ir.Opened) {
		ir.Problems = append(ir.Problems, fmt.Sprintf("egressd logged %d allowed tunnels (%d egress lines) for %d opened", res.Log.Allowed200, res.Log.EgressLines, ir.Opened))
	}
	res.PeakRSSBytes, _ = e.peakRSS()
	return []pathResult{res}, nil
}

// fitLimits reads the fd limits and how many tunnels fit in them.
func (ir *idleResult) fitLimits(pid int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	ir.BenchFDLimit = lim.Cur
	elim, err := procfs.FDLimit(pid)
	if err != nil {
		return fmt.Errorf("egressd's fd limit: %w", err)
	}
	ir.EgressdFDLimit, ir.EgressdFDsBefore = elim, countFDs(pid)
	ir.Tried, ir.Cap = idleCap(ir.Requested, ir.BenchFDLimit, countFDs(os.Getpid()), ir.EgressdFDLimit, ir.EgressdFDsBefore)
	return nil
}

// measureIdle holds the tunnels idle, then reads egressd's figures.
func (ir *idleResult) measureIdle(ctx context.Context, e *egressd) error {
	hold := time.Now()
	if err := sleepUntil(ctx, hold.Add(idleHold)); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	ir.HoldSeconds = time.Since(hold).Seconds()
	pid := e.ServingPid()
	var err error
	if ir.RSSIdleBytes, err = procfs.RSS(pid); err != nil {
		return fmt.Errorf("egressd's VmRSS: %w", err)
	}
	ir.EgressdFDsIdle = countFDs(pid)
	ir.GoroutinesIdle, _ = e.metric("go_goroutines")
	if ir.TunnelsActiveIdle, err = e.metric("egressd_tunnels_active"); err != nil {
		ir.Problems = append(ir.Problems, "with all tunnels idle: /metrics: "+err.Error())
	}
	if ir.TunnelsActiveIdle >= 0 && ir.TunnelsActiveIdle != int64(ir.Opened) {
		ir.Problems = append(ir.Problems, fmt.Sprintf("egressd_tunnels_active is %d with %d tunnels open and idle", ir.TunnelsActiveIdle, ir.Opened))
	}
	if ir.Opened > 0 {
		ir.PerTunnelBytes = float64(ir.RSSIdleBytes-ir.RSSBeforeBytes) / float64(ir.Opened)
	}
	return nil
}

// idleCap is how many of want tunnels fit in the fd limits, and why, when fewer.
func idleCap(want int, benchLimit uint64, benchOpen int, egressdLimit uint64, egressdOpen int) (int, string) {
	fit := func(limit uint64, open, per int) int {
		return int(max(0, (int64(limit)-int64(open)-fdSlack)/int64(per)))
	}
	n := min(want, fit(benchLimit, benchOpen, benchFDsPerTunnel), fit(egressdLimit, egressdOpen, egressdFDsPerTunnel))
	if n == want {
		return n, ""
	}
	return n, fmt.Sprintf("%d tunnels, not %d: the fd limits (bench %d, %d per tunnel; egressd %d, %d per tunnel) allow no more", n, want, benchLimit, benchFDsPerTunnel, egressdLimit, egressdFDsPerTunnel)
}

// tunnels are idle CONNECT tunnels: each a transport holding its one connection.
type tunnels []*http.Transport

func (ts tunnels) close() {
	for _, tr := range ts {
		tr.CloseIdleConnections()
	}
}

// openIdleTunnels opens n tunnels through the proxy at proxyAddr,
// idleOpenConcurrency at a time, each a CONNECT to the upstream's TLS port as
// localhost, a TLS handshake and one GET / read to its end; it returns those
// that opened and the failures grouped, an error only when interrupted or past
// idleOpenTimeout.
func openIdleTunnels(ctx context.Context, proxyAddr string, up *upstream, size, n int) (tunnels, map[string]int64, error) {
	openCtx, cancel := context.WithTimeout(ctx, idleOpenTimeout)
	defer cancel()
	t := target{url: "https://" + localhostAddr(up.tlsAddr) + "/", proxy: "http://" + proxyAddr, roots: up.roots, check: expectSize(size)}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		open  = make(tunnels, 0, n)
		kinds = map[string]int64{}
		wg    sync.WaitGroup
	)
	for range min(idleOpenConcurrency, n) {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && openCtx.Err() == nil {
				tctx, cancel := context.WithTimeout(openCtx, idleTunnelTimeout)
				c, err := newClient(tctx, t, new(atomic.Int64))
				if err == nil {
					err = c.roundTrip()
				}
				cancel() // the tunnel's connection outlives its one request
				mu.Lock()
				if err != nil {
					kinds[load.ErrorKind(err.Error())]++
				} else {
					open = append(open, c.tr)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := cmp.Or(ctx.Err(), openCtx.Err()); err != nil {
		open.close()
		return nil, nil, fmt.Errorf("opening %d idle tunnels (%d open within %s; try a smaller -idle-tunnels): %w", n, len(open), idleOpenTimeout, err)
	}
	return open, kinds, nil
}

// waitTunnelsZero polls egressd_tunnels_active until it is 0, for up to
// idleDrainTimeout.
func waitTunnelsZero(ctx context.Context, e *egressd) error {
	deadline := time.Now().Add(idleDrainTimeout)
	for {
		n, err := e.metric("egressd_tunnels_active")
		switch late := time.Now().After(deadline); {
		case err == nil && n == 0:
			return nil
		case err == nil && n < 0:
			return errors.New("no egressd_tunnels_active in /metrics")
		case late && err != nil:
			return fmt.Errorf("/metrics: %w", err)
		case late:
			return fmt.Errorf("egressd_tunnels_active still %d after %s", n, idleDrainTimeout)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return fmt.Errorf("interrupted: %w", err)
		}
	}
}

// countFDs is how many fds pid has open, or -1.
func countFDs(pid int) int {
	n, err := procfs.FDs(pid)
	if err != nil {
		return -1
	}
	return n
}

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// writeIdle prints the idle-tunnels row, the goal and what went wrong.
func (r *report) writeIdle(w io.Writer) {
	for _, p := range r.Paths {
		ir := p.Idle
		if ir == nil {
			continue
		}
		fmt.Fprintf(w, "\nidle tunnels (CONNECT localhost:<tlsport>, spliced, each with a TLS handshake and one GET through it, %d opened at a time; egressd's current VmRSS):\n", idleOpenConcurrency)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "tunnels\ttime to open\tRSS before\tRSS all idle\tper tunnel\tgoroutines idle\ttunnels_active idle\tfds idle\tto 0 after close\t\n")
		zero := "not in " + idleDrainTimeout.String()
		if ir.ZeroAfterCloseSeconds >= 0 {
			zero = fmt.Sprintf("%.2fs", ir.ZeroAfterCloseSeconds)
		}
		fmt.Fprintf(tw, "%s\t%.2fs\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			thousands(float64(ir.Opened)), ir.OpenSeconds, mib(ir.RSSBeforeBytes), mib(ir.RSSIdleBytes), kib(ir.PerTunnelBytes),
			count(ir.GoroutinesIdle), count(ir.TunnelsActiveIdle), count(int64(ir.EgressdFDsIdle)), zero)
		_ = tw.Flush()
		fmt.Fprintf(w, "  %s\n", idleGoalLine(ir))
		fmt.Fprintf(w, "  idle %.1fs before measuring; before opening: goroutines %s, egressd fds %s; %s; RSS %s after closing\n",
			ir.HoldSeconds, count(ir.GoroutinesBefore), count(int64(ir.EgressdFDsBefore)), perTunnelCounts(ir), mib(ir.RSSClosedBytes))
		fmt.Fprintf(w, "  fd limits (RLIMIT_NOFILE soft): bench %d, egressd %d (/proc/<pid>/limits)", ir.BenchFDLimit, ir.EgressdFDLimit)
		if ir.FDSetup != "" {
			fmt.Fprintf(w, "; %s", ir.FDSetup)
		}
		fmt.Fprintln(w)
		if ir.Cap != "" {
			fmt.Fprintf(w, "  capped: %s\n", ir.Cap)
		}
		for _, pr := range ir.Problems {
			fmt.Fprintf(w, "  problem: %s\n", pr)
		}
		if len(ir.ErrorKinds) > 0 {
			fmt.Fprintln(w, "  tunnels that failed to open:")
			writeCounts(w, ir.ErrorKinds)
		}
	}
}

// idleGoalLine compares the row with the goal: 10,000 idle CONNECT tunnels in
// at most 250 MiB of egressd's RSS, extrapolated from fewer tunnels.
func idleGoalLine(ir *idleResult) string {
	goal := fmt.Sprintf("goal: %s idle CONNECT tunnels ≤ %s of egressd RSS: ", thousands(idleGoalTunnels), mib(idleGoalBytes))
	switch {
	case ir.Opened == 0 || ir.RSSIdleBytes <= 0:
		return goal + "not measured"
	case ir.Opened >= idleGoalTunnels:
		return fmt.Sprintf("%s%s (%s with %s idle)", goal, verdict(ir.RSSIdleBytes <= idleGoalBytes), mib(ir.RSSIdleBytes), thousands(float64(ir.Opened)))
	}
	est := float64(ir.RSSBeforeBytes) + idleGoalTunnels*ir.PerTunnelBytes
	would := "would be met"
	if est > idleGoalBytes {
		would = "would NOT be met"
	}
	return fmt.Sprintf("%s%s by extrapolation (%s before + %s × %s = %s; measured with %s)", goal, would,
		mib(ir.RSSBeforeBytes), thousands(idleGoalTunnels), kib(ir.PerTunnelBytes), mib(int64(est)), thousands(float64(ir.Opened)))
}

// perTunnelCounts is the goroutines and fds egressd added per open tunnel.
func perTunnelCounts(ir *idleResult) string {
	if ir.Opened == 0 {
		return "per tunnel: n/a"
	}
	per := func(before, idle int64) string {
		if before < 0 || idle < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", float64(idle-before)/float64(ir.Opened))
	}
	return fmt.Sprintf("per tunnel: %s goroutines, %s fds", per(ir.GoroutinesBefore, ir.GoroutinesIdle), per(int64(ir.EgressdFDsBefore), int64(ir.EgressdFDsIdle)))
}

// count prints a count, or "n/a" for -1.
func count(n int64) string {
	if n < 0 {
		return "n/a"
	}
	return thousands(float64(n))
}
