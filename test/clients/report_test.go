package clients_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/egressd/egressd/internal/testutil/grpcecho"
	"github.com/egressd/egressd/internal/testutil/load"
)

// matrix is the result of every client case in each mode.
type matrix struct {
	mu   sync.Mutex
	rows map[string]map[mode]string // "client | case" -> mode -> pass, FAIL, skip
}

func newMatrix() *matrix { return &matrix{rows: map[string]map[mode]string{}} }

// track records t's result under client and name when t ends.
func (mx *matrix) track(t *testing.T, client, name string, m mode) {
	key := client + " | " + name
	t.Cleanup(func() {
		result := "pass"
		switch {
		case t.Failed():
			result = "FAIL"
		case t.Skipped():
			result = "skip"
		}
		mx.mu.Lock()
		defer mx.mu.Unlock()
		if mx.rows[key] == nil {
			mx.rows[key] = map[mode]string{}
		}
		mx.rows[key][m] = result
	})
}

func (mx *matrix) String() string {
	mx.mu.Lock()
	defer mx.mu.Unlock()
	keys := make([]string, 0, len(mx.rows))
	for k := range mx.rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "| client | case | %s | %s |\n|---|---|---|---|\n", explicit, transparent)
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", k, or(mx.rows[k][explicit], "—"), or(mx.rows[k][transparent], "—"))
	}
	return b.String()
}

// maxLatency bounds the time from the upstream's flush of a gRPC message or an
// SSE event to the client's read of it.
const maxLatency = 50 * time.Millisecond

// holdBackNote says which promise a late message breaks.
const holdBackNote = "; egressd must release bytes it holds back (because they may begin a secret) within 20 ms of the upstream pausing"

// latencies collects a mode's streamed-message latencies by kind.
type latencies struct {
	mode mode
	mu   sync.Mutex
	kind map[string][]time.Duration
}

// timedRuns is how often a timed stream may run. A message egressd holds back is
// late in every run, at the same place; one delayed by a machine busy with other
// work (the suite shares two cores with the rest of make test, and egressd is
// built with -race) is late at random. So a stream with a late message runs once
// more, and that run decides; the first is logged.
const timedRuns = 2

// measure runs stream (run n gets a path of its own) until no message is later
// than maxLatency or it ran timedRuns times, records the last run's latencies
// (message i described by label) and fails t for each of them past maxLatency.
func (l *latencies) measure(t *testing.T, kind string, label func(int) string, stream func(run int) []time.Duration) {
	t.Helper()
	var d []time.Duration
	for run := range timedRuns {
		d = stream(run)
		late := lateOnes(d, label)
		if len(late) == 0 {
			break
		}
		if run+1 < timedRuns {
			t.Logf("%s run %d: %s; late: %s; running it once more", kind, run+1, distribution(d), strings.Join(late, ", "))
		}
	}
	l.mu.Lock()
	if l.kind == nil {
		l.kind = map[string][]time.Duration{}
	}
	l.kind[kind] = append(l.kind[kind], d...)
	l.mu.Unlock()
	t.Logf("%s latency from the upstream's flush: %s", kind, distribution(d))
	for _, late := range lateOnes(d, label) {
		t.Errorf("%s %s after the upstream flushed it, want within %v%s", kind, late, maxLatency, holdBackNote)
	}
}

// lateOnes describes each latency of d past maxLatency.
func lateOnes(d []time.Duration, label func(int) string) []string {
	var out []string
	for i, x := range d {
		if x > maxLatency {
			out = append(out, fmt.Sprintf("%d (%s) read %v", i, label(i), x.Round(time.Millisecond)))
		}
	}
	return out
}

// report logs the mode's distributions on t.
func (l *latencies) report(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []time.Duration
	for _, k := range []string{"grpc", "sse"} {
		all = append(all, l.kind[k]...)
		t.Logf("%s %s: %s", l.mode, k, distribution(l.kind[k]))
	}
	t.Logf("%s all: %s", l.mode, distribution(all))
}

// distribution is "n=, p50, p99, max" of d.
func distribution(d []time.Duration) string {
	if len(d) == 0 {
		return "n=0"
	}
	l := load.Latencies(slices.Clone(d))
	q := func(q float64) time.Duration { return l.Quantile(q).Round(10 * time.Microsecond) }
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", l.N(), q(0.5), q(0.99), q(1))
}

// metadata is the metadata of every gRPC call the service saw named callID.
func (s *standIn) metadata(callID string) []metadata.MD {
	var out []metadata.MD
	for _, md := range s.svc.Metadata() {
		if v := md.Get(grpcecho.CallIDKey); len(v) == 1 && v[0] == callID {
			out = append(out, md)
		}
	}
	return out
}
