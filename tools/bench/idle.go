package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The idle-tunnels path: what an idle CONNECT tunnel costs egressd in memory.
// It opens -idle-tunnels tunnels through egressd to the upstream's TLS port as
// localhost (spliced: allowlisted, nothing intercepted), each completing the
// CONNECT, a TLS handshake with the upstream through it (so egressd has peeked
// the ClientHello and set up the splice) and one GET / (see below), then holds
// them all idle and reads egressd's VmRSS, goroutines, open fds and
// egressd_tunnels_active; then closes them all and waits for
// egressd_tunnels_active to return to 0.
//
// The GET: the upstream's http.Server has ReadHeaderTimeout 10 s and no
// IdleTimeout, so a TLS connection that never sends a request is closed 10 s
// after its handshake, which could be before the last of 10,000 tunnels is
// open; one that has had a request is an idle keep-alive connection, which it
// never times out. The response is read to the end, so no bytes are left in
// flight: every tunnel is idle both ways while egressd is measured.

const (
	idlePathName = "idle-tunnels"
	// defaultIdleTunnels and maxIdleTunnels bound -idle-tunnels.
	defaultIdleTunnels = 10000
	maxIdleTunnels     = 20000
	// benchMaxConnections is the generated config's limits.max_connections
	// (per listener; egressd's default is 10,000): above maxIdleTunnels plus
	// the load's clients, so the path measures memory, not the limit.
	benchMaxConnections = 30000
	// idleOpenConcurrency tunnels are being opened at once.
	idleOpenConcurrency = 64
	// idleTunnelTimeout bounds one tunnel's dial, CONNECT, handshake and GET.
	idleTunnelTimeout = 10 * time.Second
	// idleOpenTimeout bounds opening them all: the path fails past it.
	idleOpenTimeout = 120 * time.Second
	// idleHold is how long all tunnels sit idle before egressd is measured.
	idleHold = 2 * time.Second
	// idleDrainTimeout bounds the wait for egressd_tunnels_active to reach 0,
	// before opening (earlier paths' tunnels) and after closing.
	idleDrainTimeout = 10 * time.Second
	// idleFDLimit is the RLIMIT_NOFILE the bench raises itself (and so
	// egressd, its child) to when the path runs: the bench holds 2 fds per
	// tunnel (its end and the upstream's), egressd 2 (its two sockets; its
	// relay holds no pipe while a tunnel is idle: internal/proxy/relay.go).
	idleFDLimit = 1 << 18
	// benchFDsPerTunnel and egressdFDsPerTunnel size the cap on -idle-tunnels
	// when the fd limits cannot be raised; fdSlack is left for everything else.
	benchFDsPerTunnel   = 2
	egressdFDsPerTunnel = 2
	fdSlack             = 128
	// The goal of the issue: 10,000 idle CONNECT tunnels in at most 250 MiB
	// of egressd's RSS.
	idleGoalTunnels = 10000
	idleGoalBytes   = 250 << 20
)

// idleFDSetup is what raising RLIMIT_NOFILE did (set by prepareIdleTunnels
// before egressd starts), for the report.
var idleFDSetup string

// idleResult is the idle-tunnels row.
type idleResult struct {
	Requested int `json:"requested"`
	// Tried is how many the path tried to open: Requested unless the fd
	// limits cap it (Cap says why).
	Tried  int    `json:"tried"`
	Cap    string `json:"cap,omitempty"`
	Opened int    `json:"opened"`
	// OpenSeconds is the time to open all of them (CONNECT, TLS handshake,
	// one GET each, idleOpenConcurrency at a time).
	OpenSeconds float64 `json:"open_s"`
	HoldSeconds float64 `json:"hold_s"`
	// egressd's VmRSS (current, not the peak) before opening, with all open
	// and idle for HoldSeconds, and once they are closed; PerTunnelBytes is
	// (idle - before) / opened.
	RSSBeforeBytes int64   `json:"egressd_rss_before_bytes"`
	RSSIdleBytes   int64   `json:"egressd_rss_idle_bytes"`
	RSSClosedBytes int64   `json:"egressd_rss_after_close_bytes"`
	PerTunnelBytes float64 `json:"egressd_rss_per_tunnel_bytes"`
	// go_goroutines from egressd's /metrics; -1 when it could not be read.
	GoroutinesBefore int64 `json:"egressd_goroutines_before"`
	GoroutinesIdle   int64 `json:"egressd_goroutines_idle"`
	// egressd_tunnels_active with all idle (should equal Opened); -1 when
	// it could not be read.
	TunnelsActiveIdle int64 `json:"egressd_tunnels_active_idle"`
	// ZeroAfterCloseSeconds is how long egressd_tunnels_active took to reach
	// 0 from when the bench started closing its ends; -1 when it did not
	// within idleDrainTimeout.
	ZeroAfterCloseSeconds float64 `json:"egressd_tunnels_zero_after_close_s"`
	// Open fds in /proc/<pid>/fd, and RLIMIT_NOFILE's soft limit: the
	// bench's and egressd's (from /proc/<pid>/limits).
	EgressdFDsBefore int    `json:"egressd_fds_before"`
	EgressdFDsIdle   int    `json:"egressd_fds_idle"`
	BenchFDLimit     uint64 `json:"bench_fd_limit"`
	EgressdFDLimit   uint64 `json:"egressd_fd_limit"`
	FDSetup          string `json:"fd_setup,omitempty"`
	// Problems fail the report: tunnels that did not open, an
	// egressd_tunnels_active that does not match, or one that did not return
	// to 0.
	Problems []string `json:"problems,omitempty"`
	// ErrorKinds groups the tunnels that failed to open.
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
}

func idlePathSpec() pathSpec {
	return pathSpec{
		name: idlePathName,
		desc: fmt.Sprintf("-idle-tunnels (default %d) CONNECT tunnels to localhost:<tlsport>, spliced, each with a TLS handshake and one GET through it, "+
			"held idle %s: egressd's VmRSS, goroutines and fds with all of them idle; then closed, and egressd_tunnels_active must return to 0", defaultIdleTunnels, idleHold),
		measure: measureIdleTunnels,
	}
}

// hasIdlePath reports whether the idle-tunnels path is among ps.
func hasIdlePath(ps []pathSpec) bool {
	return slices.ContainsFunc(ps, func(p pathSpec) bool { return p.name == idlePathName })
}

// prepareIdleTunnels raises the bench's RLIMIT_NOFILE (soft and hard) to
// idleFDLimit when the idle-tunnels path runs; run calls it before egressd
// starts, which inherits it (a Setrlimit also stops os/exec from restoring the
// soft limit Go had at start in children). Without the privilege to raise the
// hard limit it raises the soft one to the hard one, and the path caps its
// tunnels to what fits.
func prepareIdleTunnels(o options) {
	if !hasIdlePath(o.paths) {
		return
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		idleFDSetup = "getrlimit: " + err.Error()
		return
	}
	want := uint64(idleFDLimit)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < want {
			want = n
		}
	}
	if lim.Cur >= want {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE already %d", lim.Cur)
		return
	}
	raised := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised)
	if err == nil {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE raised from %d (hard %d) to %d", lim.Cur, lim.Max, want)
		return
	}
	soft := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
	if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &soft); err2 != nil {
		idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE left at %d: raising it failed (%v, then %v)", lim.Cur, err, err2)
		return
	}
	idleFDSetup = fmt.Sprintf("RLIMIT_NOFILE could not be raised to %d (%v: raising the hard limit takes CAP_SYS_RESOURCE); soft limit set to the hard one, %d", want, err, lim.Max)
}

// measureIdleTunnels is the idle-tunnels path (pathSpec.measure): one row.
func measureIdleTunnels(ctx context.Context, env pathEnv) ([]pathResult, error) {
	e, up := env.e, env.w.up
	proxyAddr := strings.TrimPrefix(env.w.proxy, "http://")
	if err := loopbackOnly(proxyAddr); err != nil {
		return nil, err
	}
	pid := e.ServingPid()
	ir := &idleResult{Requested: env.o.idleTunnels, FDSetup: idleFDSetup, GoroutinesBefore: -1, GoroutinesIdle: -1, TunnelsActiveIdle: -1, ZeroAfterCloseSeconds: -1}
	res := pathResult{Path: idlePathName, Description: idlePathSpec().desc, Idle: ir}

	// The fd limits, and how many tunnels fit in them.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("getrlimit: %w", err)
	}
	ir.BenchFDLimit = lim.Cur
	elim, err := procfs.FDLimit(pid)
	if err != nil {
		return nil, fmt.Errorf("egressd's fd limit: %w", err)
	}
	ir.EgressdFDLimit = elim
	ir.EgressdFDsBefore = countFDs(pid)
	ir.Tried, ir.Cap = idleCap(ir.Requested, ir.BenchFDLimit, countFDs(os.Getpid()), ir.EgressdFDLimit, ir.EgressdFDsBefore)
	if ir.Cap != "" {
		fmt.Fprintf(env.stderr, "bench: %s: %s\n", idlePathName, ir.Cap)
	}

	// Before: earlier paths' tunnels closed, then RSS and goroutines.
	if _, err := waitTunnelsZero(ctx, e); err != nil {
		ir.Problems = append(ir.Problems, "before opening: "+err.Error())
	}
	if ir.RSSBeforeBytes, err = procfs.RSS(pid); err != nil {
		return nil, fmt.Errorf("egressd's VmRSS: %w", err)
	}
	ir.GoroutinesBefore, _ = e.metric("go_goroutines")
	from := e.LogSize()

	fmt.Fprintf(env.stderr, "bench: %s: opening %d tunnels, %d at a time\n", idlePathName, ir.Tried, idleOpenConcurrency)
	tlsConf := &tls.Config{ServerName: "localhost", RootCAs: up.roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	target := localhostAddr(up.tlsAddr)
	t0 := time.Now()
	conns, kinds, err := openIdleTunnels(ctx, proxyAddr, target, tlsConf, env.o.size, ir.Tried)
	ir.OpenSeconds = time.Since(t0).Seconds()
	ir.Opened = len(conns)
	closeAll := sync.OnceFunc(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	defer closeAll()
	if err != nil {
		return nil, err
	}
	if failed := ir.Tried - ir.Opened; failed > 0 {
		ir.ErrorKinds = kinds
		ir.Problems = append(ir.Problems, fmt.Sprintf("%d of %d tunnels failed to open", failed, ir.Tried))
	}

	// All open: hold, then measure.
	hold := time.Now()
	if err := sleepUntil(ctx, hold.Add(idleHold)); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	ir.HoldSeconds = time.Since(hold).Seconds()
	if ir.RSSIdleBytes, err = procfs.RSS(pid); err != nil {
		return nil, fmt.Errorf("egressd's VmRSS: %w", err)
	}
	ir.EgressdFDsIdle = countFDs(pid)
	if m, err := e.Metrics(); err != nil {
		ir.Problems = append(ir.Problems, "with all tunnels idle: /metrics: "+err.Error())
	} else {
		ir.GoroutinesIdle, ir.TunnelsActiveIdle = gauge(m, "go_goroutines"), gauge(m, "egressd_tunnels_active")
	}
	if ir.TunnelsActiveIdle >= 0 && ir.TunnelsActiveIdle != int64(ir.Opened) {
		ir.Problems = append(ir.Problems, fmt.Sprintf("egressd_tunnels_active is %d with %d tunnels open and idle", ir.TunnelsActiveIdle, ir.Opened))
	}
	if ir.Opened > 0 {
		ir.PerTunnelBytes = float64(ir.RSSIdleBytes-ir.RSSBeforeBytes) / float64(ir.Opened)
	}

	// Close them all: egressd_tunnels_active must return to 0.
	t1 := time.Now()
	closeAll()
	if _, err := waitTunnelsZero(ctx, e); err != nil {
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

// idleCap is how many of want tunnels fit in the fd limits (a soft limit and
// the fds already open, for the bench and egressd), and why, when fewer.
func idleCap(want int, benchLimit uint64, benchOpen int, egressdLimit uint64, egressdOpen int) (int, string) {
	fit := func(limit uint64, open, per int) int {
		n := (int64(limit) - int64(open) - fdSlack) / int64(per)
		return int(max(0, n))
	}
	b := fit(benchLimit, benchOpen, benchFDsPerTunnel)
	e := fit(egressdLimit, egressdOpen, egressdFDsPerTunnel)
	n := min(want, b, e)
	if n == want {
		return n, ""
	}
	return n, fmt.Sprintf("%d tunnels, not %d: the fd limits (bench %d, %d per tunnel; egressd %d, %d per tunnel) allow no more", n, want, benchLimit, benchFDsPerTunnel, egressdLimit, egressdFDsPerTunnel)
}

// openIdleTunnels opens n tunnels, idleOpenConcurrency at a time, and returns
// those that opened and the failures grouped. It returns an error only when
// interrupted or when opening took longer than idleOpenTimeout.
func openIdleTunnels(ctx context.Context, proxyAddr, target string, tlsConf *tls.Config, size, n int) ([]net.Conn, map[string]int64, error) {
	openCtx, cancel := context.WithTimeout(ctx, idleOpenTimeout)
	defer cancel()
	var (
		next  atomic.Int64
		mu    sync.Mutex
		conns = make([]net.Conn, 0, n)
		kinds = map[string]int64{}
		wg    sync.WaitGroup
	)
	for range min(idleOpenConcurrency, n) {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && openCtx.Err() == nil {
				c, err := openIdleTunnel(openCtx, proxyAddr, target, tlsConf, size)
				mu.Lock()
				if err != nil {
					kinds[normalizeErr(err.Error())]++
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	switch {
	case ctx.Err() != nil:
		closeConns(conns)
		return nil, nil, fmt.Errorf("interrupted: %w", ctx.Err())
	case openCtx.Err() != nil:
		closeConns(conns)
		return nil, nil, fmt.Errorf("opening %d idle tunnels took more than %s (%d open); the machine is too slow or busy, or try a smaller -idle-tunnels", n, idleOpenTimeout, len(conns))
	}
	return conns, kinds, nil
}

func closeConns(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// openIdleTunnel dials egressd, asks for CONNECT target, completes a TLS
// handshake with the upstream through the tunnel and makes one GET / on it,
// and returns the TLS connection once the response has been read to the end.
func openIdleTunnel(ctx context.Context, proxyAddr, target string, tlsConf *tls.Config, size int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, idleTunnelTimeout)
	defer cancel()
	tc, err := openTunnel(ctx, proxyAddr, target, tlsConf)
	if err != nil {
		return nil, err
	}
	if err := getThrough(ctx, tc, target, size); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// getThrough makes one GET / on tc, within ctx, and reads the response to its end.
func getThrough(ctx context.Context, tc net.Conn, target string, size int) error {
	stop := context.AfterFunc(ctx, func() { _ = tc.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", target); err != nil {
		return err
	}
	tbr := bufio.NewReaderSize(tc, 1024)
	get, err := http.ReadResponse(tbr, nil)
	if err != nil {
		return fmt.Errorf("GET through the tunnel: %w", err)
	}
	got, err := io.Copy(io.Discard, get.Body)
	get.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("GET through the tunnel: reading body: %w", err)
	case get.StatusCode != http.StatusOK:
		return fmt.Errorf("GET through the tunnel: status %d", get.StatusCode)
	case got != int64(size):
		return fmt.Errorf("GET through the tunnel: body of %d bytes, want %d", got, size)
	case tbr.Buffered() > 0:
		return errors.New("GET through the tunnel: bytes after the response")
	case !stop():
		return fmt.Errorf("opening the tunnel: %w", ctx.Err())
	}
	return nil
}

// openTunnel sends CONNECT target to egressd at proxyAddr and completes TLS
// with tlsConf inside the tunnel, within ctx.
func openTunnel(ctx context.Context, proxyAddr, target string, tlsConf *tls.Config) (*tls.Conn, error) {
	if err := loopbackOnly(proxyAddr); err != nil {
		return nil, err
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", proxyAddr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	tc, err := connectTLS(ctx, raw, target, tlsConf)
	if !stop() && err == nil {
		err = fmt.Errorf("opening the tunnel: %w", ctx.Err())
	}
	if err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// connectTLS is openTunnel's exchange on raw: the CONNECT, its 200, the handshake.
func connectTLS(ctx context.Context, raw net.Conn, target string, tlsConf *tls.Config) (*tls.Conn, error) {
	if _, err := fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(raw, 1024)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	switch {
	case err != nil:
		return nil, fmt.Errorf("CONNECT: %w", err)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("CONNECT: %w", statusError{code: resp.StatusCode, reason: resp.Header.Get("Egressd-Reason")})
	case br.Buffered() > 0:
		return nil, errors.New("CONNECT: bytes after the 200 before the TLS handshake")
	}
	tc := tls.Client(raw, tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake through the tunnel: %w", err)
	}
	return tc, nil
}

// waitTunnelsZero polls egressd_tunnels_active until it is 0, for up to
// idleDrainTimeout, and returns how long that took.
func waitTunnelsZero(ctx context.Context, e *egressd) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(idleDrainTimeout)
	last := int64(-1)
	for {
		var err error
		if last, err = e.metric("egressd_tunnels_active"); err == nil {
			if last == 0 {
				return time.Since(start), nil
			}
			if last < 0 {
				return 0, errors.New("no egressd_tunnels_active in /metrics")
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				return 0, fmt.Errorf("/metrics: %w", err)
			}
			return 0, fmt.Errorf("egressd_tunnels_active still %d after %s", last, idleDrainTimeout)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return 0, fmt.Errorf("interrupted: %w", err)
		}
	}
}

// countFDs is how many fds pid has open, or -1 when /proc/<pid>/fd cannot be
// read.
func countFDs(pid int) int {
	n, err := procfs.FDs(pid)
	if err != nil {
		return -1
	}
	return n
}

// kib prints bytes in KiB with one decimal.
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

// idleGoalLine compares the row with the goal: 10,000 idle CONNECT
// tunnels in at most 250 MiB of egressd's RSS. With fewer tunnels it
// extrapolates from the per-tunnel figure.
func idleGoalLine(ir *idleResult) string {
	goal := fmt.Sprintf("goal (issue): %s idle CONNECT tunnels ≤ %s of egressd RSS: ", thousands(idleGoalTunnels), mib(idleGoalBytes))
	switch {
	case ir.Opened == 0 || ir.RSSIdleBytes <= 0:
		return goal + "not measured"
	case ir.Opened >= idleGoalTunnels:
		verdict := "met"
		if ir.RSSIdleBytes > idleGoalBytes {
			verdict = "NOT met"
		}
		return fmt.Sprintf("%s%s (%s with %s idle)", goal, verdict, mib(ir.RSSIdleBytes), thousands(float64(ir.Opened)))
	default:
		est := float64(ir.RSSBeforeBytes) + idleGoalTunnels*ir.PerTunnelBytes
		verdict := "would be met"
		if est > idleGoalBytes {
			verdict = "would NOT be met"
		}
		return fmt.Sprintf("%s%s by extrapolation (%s before + %s × %s = %s; measured with %s)", goal, verdict,
			mib(ir.RSSBeforeBytes), thousands(idleGoalTunnels), kib(ir.PerTunnelBytes), mib(int64(est)), thousands(float64(ir.Opened)))
	}
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
