package soak_test

import (
	"fmt"
	"io"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/egressd/egressd/internal/testutil/load"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// kind is one sort of request the load sends.
type kind int

const (
	kindPlain       kind = iota // GET http://plain.soak.test: allowed, nothing injected
	kindSplice                  // GET https://splice.soak.test via CONNECT: spliced
	kindTransform               // GET https://xform.soak.test: intercepted, transform injected
	kindCred                    // GET https://cred.soak.test: intercepted, credential injected
	kindHookPre                 // POST the pre_tool_execution hook: signed, endpoint's allow/deny
	kindHookPost                // POST the post_tool_execution hook: signed, forwarded
	kindDenyHTTP                // plain-http requests egressd must refuse
	kindDenyConnect             // CONNECTs egressd must refuse
	numKinds
)

var kindNames = [numKinds]string{
	"plain http", "CONNECT spliced", "intercepted+transform", "intercepted+credential",
	"hook pre_tool", "hook post_tool", "denied http", "denied CONNECT",
}

func (k kind) String() string { return kindNames[k] }

// maxExamples is how many examples the report keeps per group.
const maxExamples = 3

// group counts occurrences of one thing and keeps a few examples.
type group struct {
	n        int64
	examples []string
}

func (g *group) add(example string) {
	g.n++
	if len(g.examples) < maxExamples {
		g.examples = append(g.examples, example)
	}
}

// latencyBounds are the upper bounds of the latency histogram's buckets; one more
// bucket holds everything above the last.
var latencyBounds = [...]time.Duration{
	time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 7 * time.Millisecond,
	10 * time.Millisecond, 15 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond,
	70 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond,
	500 * time.Millisecond, 700 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second,
	3 * time.Second, 5 * time.Second, 7 * time.Second, 10 * time.Second, 15 * time.Second,
}

// latency is a histogram of request durations.
type latency struct {
	buckets [len(latencyBounds) + 1]atomic.Int64
	max     atomic.Int64 // nanoseconds
}

func (l *latency) observe(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	l.buckets[i].Add(1)
	for {
		m := l.max.Load()
		if int64(d) <= m || l.max.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

// quantile is the upper bound of the bucket that holds the q-quantile ("≤ that").
func (l *latency) quantile(q float64) string {
	var n int64
	for i := range l.buckets {
		n += l.buckets[i].Load()
	}
	if n == 0 {
		return "-"
	}
	want, seen := int64(q*float64(n)+0.5), int64(0)
	for i := range l.buckets {
		if seen += l.buckets[i].Load(); seen >= max(want, 1) {
			if i == len(latencyBounds) {
				return ">" + latencyBounds[i-1].String()
			}
			return latencyBounds[i].String()
		}
	}
	return "-"
}

// tally is everything the soak counts. It is safe for concurrent use.
type tally struct {
	ok, wrong, transport, late [numKinds]atomic.Int64
	latency                    [numKinds]latency

	mu         sync.Mutex
	violations map[string]*group // by check
	errors     map[string]*group // transport errors, by kind and normalised message
	lateErrors map[string]*group // transport errors after the load's end (excluded)
	outcomes   map[string]int64  // finer outcomes: "hook pre_tool: deny", "denied http: not_allowlisted"

	reloadOK, reloadRejected map[string]int // by trigger: sighup, admin
	rotations                int
	notes                    []string // worth a look, not failures
}

func (t *tally) note(s string) {
	t.mu.Lock()
	if len(t.notes) < 20 {
		t.notes = append(t.notes, s)
	}
	t.mu.Unlock()
}

func newTally() *tally {
	return &tally{
		violations: map[string]*group{}, errors: map[string]*group{}, lateErrors: map[string]*group{},
		outcomes: map[string]int64{}, reloadOK: map[string]int{}, reloadRejected: map[string]int{},
	}
}

// violation records a request served with the wrong policy, or any other broken
// promise, under the check that caught it.
func (t *tally) violation(check, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.violations[check]
	if g == nil {
		g = &group{}
		t.violations[check] = g
	}
	g.add(truncate(fmt.Sprintf(format, args...), 400))
}

func (t *tally) outcome(k kind, what string) {
	t.mu.Lock()
	t.outcomes[k.String()+": "+what]++
	t.mu.Unlock()
}

// requestID matches the load's request IDs, which differ on every request and
// would split one kind of error into thousands of groups (as addresses would:
// load.ErrorKind masks those).
var requestID = regexp.MustCompile(`c\d+-\d+`)

// transportError records a request that got no HTTP answer; late ones (the load had
// ended when it failed) are counted apart and excluded from the verdict.
func (t *tally) transportError(k kind, id string, err error, late bool) {
	key := k.String() + ": " + requestID.ReplaceAllString(load.ErrorKind(err.Error()), "…")
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.errors
	if late {
		m = t.lateErrors
		t.late[k].Add(1)
	} else {
		t.transport[k].Add(1)
	}
	g := m[key]
	if g == nil {
		g = &group{}
		m[key] = g
	}
	g.add(fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), id, err))
}

func (t *tally) violationCount() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, g := range t.violations {
		n += g.n
	}
	return n
}

// snippet is a body for a message: spaces trimmed, at most n bytes.
func snippet(b []byte, n int) string { return truncate(strings.TrimSpace(string(b)), n) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// report is what the soak prints at the end.
type report struct {
	s          settings
	loadTime   time.Duration
	idle       sample // before the load
	samples    []sample
	after      sample // after the load, clients' connections closed
	growth     []growth
	tally      *tally
	creds      *credTracker
	hooks      *hookEndpoint
	adminRel   bool // POST /v1/reload was available
	exitCode   int
	logSummary logSummary
	failures   []string

	loadAvgStart, loadAvgEnd string // /proc/loadavg's 1-minute figure
}

// loadAvg is the 1-minute load average, "?" when unknown.
func loadAvg() string {
	if l, err := procfs.LoadAvg(); err == nil {
		return strconv.FormatFloat(l, 'f', 2, 64)
	}
	return "?"
}

func (r *report) write(w io.Writer) {
	fmt.Fprintf(w, "\n=== egressd soak: %v of load, %d clients, target %d req/s ===\n\n", r.loadTime.Round(time.Second), r.s.clients, r.s.rate)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "resource\tidle before\tfirst sample\tbaseline (3-5)\tend (last 3)\tgrowth\tlimit\tafter load\tverdict\t")
	first := sample{}
	if len(r.samples) > 0 {
		first = r.samples[0]
	}
	for _, g := range r.growth {
		pick := map[string]func(sample) int64{
			"goroutines": func(s sample) int64 { return s.goroutines },
			"open fds":   func(s sample) int64 { return s.fds },
			"RSS":        func(s sample) int64 { return s.rss },
		}[g.name]
		verdict := "ok"
		switch {
		case !g.checked:
			verdict = "not judged (<6 samples)"
		case g.failed:
			verdict = "GROWTH"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%+.0f%% (%s)\t+%.0f%% and +%s\t%s\t%s\t\n", g.name,
			g.formatUnit(pick(r.idle)), g.formatUnit(pick(first)), g.formatUnit(g.base), g.formatUnit(g.end),
			100*g.rel, signed(g.end-g.base, g.formatUnit), 100*g.limitRel, g.formatUnit(g.limitAbs),
			g.formatUnit(pick(r.after)), verdict)
	}
	fmt.Fprintf(tw, "tunnels_active\t%d\t%d\t\t%d\t\t\t%d\t\t\n", r.idle.tunnels, first.tunnels, avg(r.samples[max(0, len(r.samples)-endWindow):]).tunnels, r.after.tunnels)
	tw.Flush()

	fmt.Fprintf(w, "\nsamples (every %v): t, goroutines, fds, RSS, tunnels\n", sampleEvery)
	for _, s := range r.samples {
		fmt.Fprintf(w, "  %6v %6d %6d %10s %4d\n", s.at.Round(time.Second), s.goroutines, s.fds, mib(s.rss), s.tunnels)
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "requests\ttotal\tright policy\twrong policy\ttransport errors\tafter load end (excluded)\tp50\tp99\tmax\t")
	var tot [5]int64
	for k := range numKinds {
		ok, wrong, tr, late := r.tally.ok[k].Load(), r.tally.wrong[k].Load(), r.tally.transport[k].Load(), r.tally.late[k].Load()
		n := ok + wrong + tr + late
		lat := &r.tally.latency[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t≤%s\t≤%s\t%v\t\n", k, n, ok, wrong, tr, late,
			lat.quantile(0.5), lat.quantile(0.99), time.Duration(lat.max.Load()).Round(time.Millisecond))
		for i, v := range []int64{n, ok, wrong, tr, late} {
			tot[i] += v
		}
	}
	fmt.Fprintf(tw, "all\t%d\t%d\t%d\t%d\t%d\t\t\t\t\n", tot[0], tot[1], tot[2], tot[3], tot[4])
	tw.Flush()
	if r.loadTime > 0 {
		fmt.Fprintf(w, "  %.0f req/s achieved (the clients send one request at a time each: a busy machine slows them);"+
			" load average %s at the start, %s at the end, %d CPUs\n",
			float64(tot[0])/r.loadTime.Seconds(), r.loadAvgStart, r.loadAvgEnd, runtime.NumCPU())
	}

	fmt.Fprintln(w, "\noutcomes:")
	r.tally.mu.Lock()
	for _, k := range slices.Sorted(maps.Keys(r.tally.outcomes)) {
		fmt.Fprintf(w, "  %-48s %d\n", k, r.tally.outcomes[k])
	}
	fmt.Fprintf(w, "\nreloads: %d ok (sighup %d, POST /v1/reload %d), %d rejected as they must be (sighup %d, POST /v1/reload %d)",
		r.tally.reloadOK["sighup"]+r.tally.reloadOK["admin"], r.tally.reloadOK["sighup"], r.tally.reloadOK["admin"],
		r.tally.reloadRejected["sighup"]+r.tally.reloadRejected["admin"], r.tally.reloadRejected["sighup"], r.tally.reloadRejected["admin"])
	if !r.adminRel {
		fmt.Fprint(w, "; POST /v1/reload not served by this build, SIGHUP only")
	}
	fmt.Fprintf(w, "\ncredential rotations: %d; upstream saw the current token %d times, the previous one within the %v grace %d, stale after it %d, unknown %d\n",
		r.tally.rotations, r.creds.current.Load(), r.creds.grace, r.creds.inGrace.Load(), r.creds.stale.Load(), r.creds.unknown.Load())
	fmt.Fprintf(w, "hook calls answered by the endpoint (pre-tool, alternating): %d\n", r.hooks.calls.Load())
	fmt.Fprintf(w, "egressd: exit %d after SIGTERM; %s\n", r.exitCode, r.logSummary)

	for _, n := range r.tally.notes {
		fmt.Fprintln(w, "note: "+n)
	}
	var nv int64
	for _, g := range r.tally.violations {
		nv += g.n
	}
	fmt.Fprintf(w, "\nviolations: %d\n", nv)
	writeGroups(w, r.tally.violations)
	if len(r.tally.errors) > 0 {
		fmt.Fprintln(w, "\ntransport errors during the load:")
		writeGroups(w, r.tally.errors)
	}
	if len(r.tally.lateErrors) > 0 {
		fmt.Fprintln(w, "\ntransport errors after the load's end (excluded):")
		writeGroups(w, r.tally.lateErrors)
	}
	r.tally.mu.Unlock()
	if len(r.logSummary.unexpected) > 0 {
		fmt.Fprintln(w, "\nunexpected egressd log lines:")
		writeGroups(w, r.logSummary.unexpected)
	}

	if len(r.failures) == 0 {
		fmt.Fprintln(w, "\nRESULT: PASS")
		return
	}
	fmt.Fprintln(w, "\nRESULT: FAIL")
	for _, f := range r.failures {
		fmt.Fprintln(w, "  - "+f)
	}
}

func writeGroups(w io.Writer, m map[string]*group) {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		g := m[k]
		fmt.Fprintf(w, "  %6d  %s\n", g.n, k)
		for _, ex := range g.examples {
			fmt.Fprintf(w, "            e.g. %s\n", ex)
		}
	}
}

func signed(n int64, unit func(int64) string) string {
	if n < 0 {
		return "-" + unit(-n)
	}
	return "+" + unit(n)
}

// logSummary is what egressd's log says about the run.
type logSummary struct {
	lines, egress int64
	decisions     map[string]int64 // egress lines by decision
	reloads       map[string]int64 // reload lines by source (sighup, admin, file) and result
	warns         map[string]int64 // warn lines by message
	unexpected    map[string]*group
	secretLeaks   int64
	stderrBytes   int
	stderrExample string
	stoppedOK     bool
}

func (l logSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "log: %d lines, %d egress (", l.lines, l.egress)
	for i, k := range slices.Sorted(maps.Keys(l.decisions)) {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, l.decisions[k])
	}
	b.WriteString("), reloads by source:")
	for _, k := range slices.Sorted(maps.Keys(l.reloads)) {
		fmt.Fprintf(&b, " %s %d", k, l.reloads[k])
	}
	for _, k := range slices.Sorted(maps.Keys(l.warns)) {
		fmt.Fprintf(&b, ", warn %q ×%d", k, l.warns[k])
	}
	fmt.Fprintf(&b, "; credential tokens in the log: %d; stderr: %d bytes", l.secretLeaks, l.stderrBytes)
	return b.String()
}
