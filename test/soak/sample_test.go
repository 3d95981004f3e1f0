package soak_test

import (
	"fmt"
	"strconv"
	"time"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// sampleEvery is the sampling period during the load.
const sampleEvery = 10 * time.Second

// The growth check: the average of the last endWindow samples is compared with the
// average of the baseline samples (the 3rd to 5th, 1-based: the first 20 s are
// warm-up: pools filling, leaves minted, the JWKS fetched, the runtime's heap
// growing to its working size). A resource fails only when it grew by more than
// BOTH its relative and its absolute limit: the relative one ignores noise on small
// numbers, the absolute one ignores proportional noise on large ones. A leak of
// one goroutine, file or a few KiB per request grows without bound and trips both
// within minutes at the soak's rate (hundreds of requests a second); the limits are
// loose enough that a 16-client load's jitter (goroutines and fds follow the
// connections that happen to be open at the instant of the sample; RSS follows the
// GC's cycle) does not.
const (
	baseFrom, baseTo = 2, 5 // samples[2:5]: the 3rd to 5th
	endWindow        = 3
	minSamples       = baseTo + 1 // fewer (a load of 60 s or less) and growth is only reported

	goroutineGrowthRel = 0.50
	goroutineGrowthAbs = 100
	fdGrowthRel        = 0.50
	fdGrowthAbs        = 100
	rssGrowthRel       = 0.50
	rssGrowthAbs       = 30 << 20 // bytes
)

// sample is one look at egressd.
type sample struct {
	at         time.Duration // since the load started; negative before it
	goroutines int64         // go_goroutines from /metrics
	fds        int64         // entries of /proc/<pid>/fd
	rss        int64         // VmRSS, bytes
	tunnels    int64         // egressd_tunnels_active from /metrics
}

// takeSample reads egressd's goroutines and tunnels from /metrics and its open
// files and resident set from /proc.
func takeSample(e *egressd, at time.Duration) (sample, error) {
	s := sample{at: at}
	m, err := e.Metrics()
	if err != nil {
		return s, err
	}
	g, ok1 := m[seriesGoroutines]
	tu, ok2 := m[seriesTunnels]
	if !ok1 || !ok2 {
		return s, fmt.Errorf("/metrics lacks %s or %s", seriesGoroutines, seriesTunnels)
	}
	s.goroutines, s.tunnels = int64(g), int64(tu)
	if s.fds, err = procFDs(e.ServingPid()); err != nil {
		return s, err
	}
	s.rss, err = procRSS(e.ServingPid())
	return s, err
}

func procFDs(pid int) (int64, error) {
	n, err := procfs.FDs(pid)
	return int64(n), err
}

func procRSS(pid int) (int64, error) { return procfs.RSS(pid) }

// avg is the per-field average of samples.
func avg(ss []sample) sample {
	var a sample
	if len(ss) == 0 {
		return a
	}
	for _, s := range ss {
		a.goroutines += s.goroutines
		a.fds += s.fds
		a.rss += s.rss
		a.tunnels += s.tunnels
	}
	n := int64(len(ss))
	return sample{goroutines: a.goroutines / n, fds: a.fds / n, rss: a.rss / n, tunnels: a.tunnels / n}
}

// growth is one resource's verdict.
type growth struct {
	name       string
	base, end  int64
	rel        float64 // (end-base)/base
	limitRel   float64
	limitAbs   int64
	failed     bool
	checked    bool // false: too few samples to judge
	formatUnit func(int64) string
}

func checkGrowth(samples []sample) []growth {
	checked := len(samples) >= minSamples
	var base, end sample
	if len(samples) > 0 {
		lo, hi := min(baseFrom, len(samples)-1), min(baseTo, len(samples))
		base = avg(samples[lo:hi])
		end = avg(samples[max(0, len(samples)-endWindow):])
	}
	mk := func(name string, b, e int64, rel float64, abs int64, unit func(int64) string) growth {
		g := growth{name: name, base: b, end: e, limitRel: rel, limitAbs: abs, checked: checked, formatUnit: unit}
		if b > 0 {
			g.rel = float64(e-b) / float64(b)
		}
		g.failed = checked && float64(e) > float64(b)*(1+rel) && e-b > abs
		return g
	}
	return []growth{
		mk("goroutines", base.goroutines, end.goroutines, goroutineGrowthRel, goroutineGrowthAbs, plain),
		mk("open fds", base.fds, end.fds, fdGrowthRel, fdGrowthAbs, plain),
		mk("RSS", base.rss, end.rss, rssGrowthRel, rssGrowthAbs, mib),
	}
}

func plain(n int64) string { return strconv.FormatInt(n, 10) }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
