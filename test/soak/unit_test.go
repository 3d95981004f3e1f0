package soak_test

import (
	"fmt"
	"testing"
	"time"
)

// These tests check the soak's own logic; they run in `go test ./...`, without
// EGRESSD_SOAK, in milliseconds.

// TestCheckGrowth: a resource fails only when the end exceeds the baseline by both
// its relative and its absolute limit, and nothing is judged on too few samples.
func TestCheckGrowth(t *testing.T) {
	const mb = 1 << 20
	series := func(n int, from, to sample) []sample {
		ss := make([]sample, n)
		for i := range ss {
			f := float64(i) / float64(n-1)
			lerp := func(a, b int64) int64 { return a + int64(f*float64(b-a)) }
			ss[i] = sample{goroutines: lerp(from.goroutines, to.goroutines), fds: lerp(from.fds, to.fds), rss: lerp(from.rss, to.rss)}
		}
		return ss
	}
	flat := sample{goroutines: 100, fds: 100, rss: 30 * mb}
	cases := []struct {
		name       string
		samples    []sample
		wantFailed []string // resources that must fail
		checked    bool
	}{
		{"flat", series(12, flat, flat), nil, true},
		{"goroutine leak", series(60, flat, sample{goroutines: 400, fds: 100, rss: 30 * mb}), []string{"goroutines"}, true},
		{"small numbers grow by half but by less than 100", series(60, sample{goroutines: 40, fds: 40, rss: 30 * mb}, sample{goroutines: 120, fds: 120, rss: 30 * mb}), nil, true},
		{"large numbers grow by more than 100 but by less than half", series(60, sample{goroutines: 1000, fds: 1000, rss: 300 * mb}, sample{goroutines: 1300, fds: 1300, rss: 400 * mb}), nil, true},
		{"fd and RSS leak", series(60, flat, sample{goroutines: 100, fds: 400, rss: 90 * mb}), []string{"open fds", "RSS"}, true},
		{"too few samples", series(5, flat, sample{goroutines: 1000, fds: 1000, rss: 900 * mb}), nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failed []string
			for _, g := range checkGrowth(tc.samples) {
				if g.checked != tc.checked {
					t.Errorf("%s: checked = %v, want %v", g.name, g.checked, tc.checked)
				}
				if g.failed {
					failed = append(failed, g.name)
				}
			}
			if fmt.Sprint(failed) != fmt.Sprint(tc.wantFailed) {
				t.Errorf("failed %v, want %v", failed, tc.wantFailed)
			}
		})
	}
}

// TestOperatorSchedule: reloads every 30 s and rotations every minute from 45 s,
// none in the last seconds of the load, and the reload plan that meets every kind
// of reload with every trigger.
func TestOperatorSchedule(t *testing.T) {
	o := &operator{}
	for _, tc := range []struct {
		d                  time.Duration
		reloads, rotations int
	}{
		{time.Minute, 1, 1},
		{2 * time.Minute, 3, 2},
		{10 * time.Minute, 19, 10},
	} {
		evs := o.schedule(tc.d)
		if len(evs) != tc.reloads+tc.rotations {
			t.Errorf("%v: %d events, want %d reloads and %d rotations", tc.d, len(evs), tc.reloads, tc.rotations)
		}
		for i, ev := range evs {
			if i > 0 && ev.at < evs[i-1].at {
				t.Errorf("%v: events out of order at %d", tc.d, i)
			}
			if ev.at > tc.d-opsTail {
				t.Errorf("%v: an event at %v, within %v of the end", tc.d, ev.at, opsTail)
			}
		}
	}
	seen := map[string]bool{}
	for n := range 4 {
		valid, trigger := reloadPlan(n, true)
		seen[fmt.Sprint(valid, trigger)] = true
		if _, tr := reloadPlan(n, false); tr != "sighup" {
			t.Errorf("reload %d without POST /v1/reload: trigger %s", n, tr)
		}
	}
	if len(seen) != 4 {
		t.Errorf("four reloads cover %v, want every kind with every trigger", seen)
	}
	if v, tr := reloadPlan(1, true); v || tr != "admin" {
		t.Errorf("reload 2 (of a 2-minute run) is valid=%v by %s, want a broken file by POST", v, tr)
	}
}
