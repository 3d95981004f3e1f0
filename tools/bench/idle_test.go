package main

import (
	"strings"
	"testing"
)

func TestWriteIdle(t *testing.T) {
	ir := &idleResult{
		Requested: 10000, Tried: 10000, Opened: 10000, OpenSeconds: 21.5, HoldSeconds: 2,
		RSSBeforeBytes: 20 << 20, RSSIdleBytes: 200 << 20, RSSClosedBytes: 150 << 20,
		PerTunnelBytes:   float64(180<<20) / 10000,
		GoroutinesBefore: 12, GoroutinesIdle: 20012, TunnelsActiveIdle: 10000,
		EgressdFDsBefore: 11, EgressdFDsIdle: 60011, BenchFDLimit: 262144, EgressdFDLimit: 262144,
		ZeroAfterCloseSeconds: 0.42, FDSetup: "RLIMIT_NOFILE raised from 20000 (hard 20000) to 262144",
	}
	r := &report{Settings: settings{Clients: 64, SizeBytes: 1024, DurationS: 4, Rounds: 1, CPUs: 2},
		Paths: []pathResult{{Path: idlePathName, Idle: ir, PeakRSSBytes: 210 << 20}}}
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"tunnels  time to open  RSS before  RSS all idle  per tunnel  goroutines idle  tunnels_active idle  fds idle  to 0 after close",
		"10,000        21.50s    20.0 MiB     200.0 MiB    18.4 KiB           20,012               10,000    60,011             0.42s",
		"goal: 10,000 idle CONNECT tunnels ≤ 250.0 MiB of egressd RSS: met (200.0 MiB with 10,000 idle)",
		"per tunnel: 2.0 goroutines, 6.0 fds; RSS 150.0 MiB after closing",
		"fd limits (RLIMIT_NOFILE soft): bench 262144, egressd 262144 (/proc/<pid>/limits); RLIMIT_NOFILE raised from 20000",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	row := false
	for l := range strings.Lines(out) {
		if f := strings.Fields(l); len(f) > 2 && f[0] == idlePathName && f[1] == "idle:" && strings.HasSuffix(strings.TrimSpace(l), "210.0 MiB") {
			row = true
		}
		if strings.HasPrefix(strings.TrimSpace(l), idlePathName+" ") && strings.Contains(l, "direct") {
			t.Errorf("the idle row is in the details table: %s", l)
		}
	}
	if !row {
		t.Errorf("no main table row for %s with its VmHWM:\n%s", idlePathName, out)
	}
	if r.failed() {
		t.Error("a clean idle row fails the report")
	}

}

// Over the goal, then fewer tunnels (a cap): the goal is extrapolated; then
// problems and failed tunnels are printed and fail the report.
func TestWriteIdleGoal(t *testing.T) {
	ir := &idleResult{Opened: 10000, RSSBeforeBytes: 20 << 20, PerTunnelBytes: float64(180<<20) / 10000}
	r := &report{Paths: []pathResult{{Path: idlePathName, Idle: ir}}}
	ir.RSSIdleBytes = 300 << 20
	if got := idleGoalLine(ir); !strings.HasSuffix(got, "NOT met (300.0 MiB with 10,000 idle)") {
		t.Errorf("goal line = %q", got)
	}
	ir.Opened, ir.Tried, ir.Cap = 3246, 3246, "3246 tunnels, not 10000: the fd limits allow no more"
	ir.RSSBeforeBytes, ir.PerTunnelBytes = 18<<20, 20*1024
	if got, want := idleGoalLine(ir), "would be met by extrapolation (18.0 MiB before + 10,000 × 20.0 KiB = 213.3 MiB; measured with 3,246)"; !strings.HasSuffix(got, want) {
		t.Errorf("goal line = %q, want it to end in %q", got, want)
	}
	ir.PerTunnelBytes = 30 * 1024
	if got := idleGoalLine(ir); !strings.Contains(got, "would NOT be met by extrapolation") {
		t.Errorf("goal line = %q", got)
	}

	// Problems and failed tunnels are printed and fail the report.
	ir.Problems = []string{"egressd_tunnels_active still 3 after 10s"}
	ir.ErrorKinds = map[string]int64{"CONNECT: status 503": 2}
	ir.ZeroAfterCloseSeconds, ir.GoroutinesIdle = -1, -1
	var b strings.Builder
	r.writeIdle(&b)
	out := b.String()
	for _, want := range []string{"capped: 3246 tunnels, not 10000", "problem: egressd_tunnels_active still 3 after 10s",
		"tunnels that failed to open:", "2  CONNECT: status 503", "not in 10s", "n/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("idle lacks %q:\n%s", want, out)
		}
	}
	if !r.failed() {
		t.Error("idle problems do not fail the report")
	}
}

func TestIdleCap(t *testing.T) {
	for _, tc := range []struct {
		want, benchOpen, egressdOpen int
		benchLimit, egressdLimit     uint64
		n                            int
		capped                       bool
	}{
		{10000, 20, 10, 262144, 262144, 10000, false},
		{10000, 20, 12, 20000, 20000, min(20000-12-fdSlack, 20000-20-fdSlack) / egressdFDsPerTunnel, true},
		{10000, 19000, 10, 20000, 262144, (20000 - 19000 - fdSlack) / benchFDsPerTunnel, true},
		{10000, 30000, 10, 20000, 262144, 0, true},
	} {
		n, why := idleCap(tc.want, tc.benchLimit, tc.benchOpen, tc.egressdLimit, tc.egressdOpen)
		if n != tc.n || (why != "") != tc.capped {
			t.Errorf("idleCap(%+v) = %d, %q; want %d", tc, n, why, tc.n)
		}
	}
}
