package egressdtest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// WaitTimeout bounds the waits of the T helpers below.
const WaitTimeout = 10 * time.Second

// StartT is Start for a test: Dir defaults to a fresh t.TempDir(), a failure to
// start fails the test, and at its end egressd is killed if still running and,
// when the test failed, its output is logged (without the per-request lines but
// the last few). Register a Stop with assertions after StartT: cleanups run last
// first, so it runs before the kill.
func StartT(t testing.TB, o Options) *Egressd {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	e, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Kill()
		if t.Failed() {
			t.Logf("%s", e.Summary(20))
		}
	})
	return e
}

// Summary is egressd's output for a failed test: stderr, the log lines that are
// not canonical "egress" lines, and the last n of those.
func (e *Egressd) Summary(n int) string {
	var shown, egress []string
	for raw := range bytes.Lines(e.LogBytes()) {
		s := strings.TrimRight(string(raw), "\n")
		if bytes.Contains(raw, egressMarker) {
			egress = append(egress, s)
		} else {
			shown = append(shown, s)
		}
	}
	total := len(egress)
	if len(egress) > n {
		egress = egress[len(egress)-n:]
	}
	return fmt.Sprintf("egressd stdout, without its per-request lines:\n%s\nthe last %d of %d per-request lines:\n%s\negressd stderr:\n%s",
		strings.Join(shown, "\n"), len(egress), total, strings.Join(egress, "\n"), e.Stderr())
}

// WaitLineT waits (WaitTimeout) for the first line that match accepts, or fails t.
func (e *Egressd) WaitLineT(t testing.TB, desc string, match func(Line) bool) Line {
	t.Helper()
	return e.WaitNthT(t, desc, 1, match)
}

// WaitNthT waits (WaitTimeout) for the nth line that match accepts, or fails t.
func (e *Egressd) WaitNthT(t testing.TB, desc string, n int, match func(Line) bool) Line {
	t.Helper()
	l, err := e.WaitNth(WaitTimeout, n, match)
	if err != nil {
		t.Fatalf("egressd did not log %s: %v", desc, err)
	}
	return l
}

// EgressLine waits for the canonical log line of the request reqID, or fails t.
func (e *Egressd) EgressLine(t testing.TB, reqID string) Line {
	t.Helper()
	return e.WaitLineT(t, "the egress line of "+reqID, IsEgress(reqID))
}

// MetricT is one series' value, or fails t when /metrics does not export it.
func (e *Egressd) MetricT(t testing.TB, series string) float64 {
	t.Helper()
	v, ok, err := e.Metric(series)
	switch {
	case err != nil:
		t.Fatal(err)
	case !ok:
		t.Fatalf("/metrics does not export %s", series)
	}
	return v
}
