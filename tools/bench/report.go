package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// report is everything one bench run found, printed as a table or as JSON.
type report struct {
	Settings settings     `json:"settings"`
	Paths    []pathResult `json:"paths"`
	// PeakRSSBytes is egressd's VmHWM at the end: the peak over every run.
	PeakRSSBytes int64  `json:"egressd_peak_rss_bytes"`
	RSSError     string `json:"egressd_rss_error,omitempty"`
	// LeafCache is egressd_leaf_cache_total from /metrics at the end.
	LeafCache      *leafCounts `json:"egressd_leaf_cache,omitempty"`
	LeafCacheError string      `json:"egressd_leaf_cache_error,omitempty"`
	// EgressdExit is "" when egressd exited 0 on SIGTERM, else how it ended.
	EgressdExit string `json:"egressd_exit,omitempty"`
	// VaultEgressdExit is the same for the second egressd, the vault path's.
	VaultEgressdExit string `json:"vault_egressd_exit,omitempty"`
	// Peers are the peer proxies of the run (peers.go): binary or why
	// skipped, peak RSS, exit. Their figures are in each path's Peers.
	Peers []peerInfo `json:"peers,omitempty"`
}

type settings struct {
	Clients    int     `json:"clients"`
	SizeBytes  int     `json:"size_bytes"`
	DurationS  float64 `json:"duration_s"`
	WarmupS    float64 `json:"warmup_s"`
	Rounds     int     `json:"rounds"`
	CPUs       int     `json:"cpus"`
	GoVersion  string  `json:"go_version"`
	ClockTicks int64   `json:"clock_ticks_per_s"`
	// LoadAvg is the 1-minute load average when the bench started: other
	// work on the machine makes every figure noisy, the ratio included.
	LoadAvg float64 `json:"load_avg_1m"`
}

// pathResult is one path: its direct runs, its runs through egressd, compared.
type pathResult struct {
	Path        string `json:"path"`
	Description string `json:"description"`
	// Skipped says why the path was not measured (the vault path without a
	// Vault dev server); every other field is then empty.
	Skipped           string `json:"skipped,omitempty"`
	Injects           string `json:"injects,omitempty"` // what egressd adds to every request
	NewConnPerRequest bool   `json:"new_conn_per_request,omitempty"`
	// Direct and Egressd are every round's runs together: req/s is the median
	// of the rounds, latencies are over all rounds' requests, counts are sums.
	Direct  runResult `json:"direct"`
	Egressd runResult `json:"egressd"`
	// Ratio is the median over the rounds of egressd's req/s over the direct
	// req/s of the same round.
	Ratio float64 `json:"ratio"`
	// CPUPerReqUS is the median over the rounds of egressd's CPU time in the
	// window over the requests completed in it.
	CPUPerReqUS float64       `json:"egressd_cpu_us_per_req"`
	Rounds      []roundResult `json:"rounds"`
	Log         logSummary    `json:"egressd_log"`
	// LeafCache is how egressd_leaf_cache_total grew during the path's runs.
	LeafCache      *leafCounts `json:"egressd_leaf_cache,omitempty"`
	LeafCacheError string      `json:"egressd_leaf_cache_error,omitempty"`
	// DNSQueries is how many queries the DNS stub answered during the path.
	DNSQueries int64 `json:"dns_queries"`
	// PeakRSSBytes is egressd's VmHWM after the path (the peak so far).
	PeakRSSBytes int64 `json:"egressd_peak_rss_after_bytes"`
	// Problems are failed injection checks: requests that reached the
	// upstream without what egressd must inject, or with what it must not.
	Problems []string `json:"problems,omitempty"`
	// Attack is what the hook-attack row's attack held (hookattack.go).
	Attack *attackSummary `json:"attack,omitempty"`
	// Idle is the idle-tunnels row's figures (idle.go); it has no runs.
	Idle *idleResult `json:"idle_tunnels,omitempty"`
	// Peers are the same rounds' runs through each peer proxy that carries
	// the path (peers.go), in -peers order.
	Peers []peerResult `json:"peers,omitempty"`
}

// roundResult is one direct run and the egressd run after it.
type roundResult struct {
	DirectReqPerSec  float64 `json:"direct_req_per_s"`
	EgressdReqPerSec float64 `json:"egressd_req_per_s"`
	Ratio            float64 `json:"ratio"`
	CPUPerReqUS      float64 `json:"egressd_cpu_us_per_req"`
	cpuOK            bool
}

func newRound(direct, via runResult) roundResult {
	r := roundResult{DirectReqPerSec: direct.ReqPerSec, EgressdReqPerSec: via.ReqPerSec}
	if direct.ReqPerSec > 0 {
		r.Ratio = via.ReqPerSec / direct.ReqPerSec
	}
	if via.Requests > 0 && via.CPUError == "" {
		r.CPUPerReqUS, r.cpuOK = via.CPUSeconds*1e6/float64(via.Requests), true
	}
	return r
}

// combine folds the rounds' runs of one side of a path into one result.
func combine(runs []runResult) runResult {
	var r runResult
	rates := make([]float64, len(runs))
	for i := range runs {
		x := &runs[i]
		rates[i] = x.ReqPerSec
		r.Requests += x.Requests
		r.Seconds += x.Seconds
		r.Total += x.Total
		r.Errors += x.Errors
		addCounts(&r.ErrorKinds, x.ErrorKinds)
		r.ClientConns += x.ClientConns
		r.UpstreamConns += x.UpstreamConns
		r.UpstreamRequests += x.UpstreamRequests
		r.Transformed += x.Transformed
		r.Credentialed += x.Credentialed
		r.VaultCredentialed += x.VaultCredentialed
		r.OAuthCredentialed += x.OAuthCredentialed
		r.TLSHandshakes += x.TLSHandshakes
		r.TLSResumed += x.TLSResumed
		r.CPUSeconds += x.CPUSeconds
		if x.CPUError != "" {
			r.CPUError = x.CPUError
		}
		r.hist.merge(&x.hist)
	}
	r.ReqPerSec = median(rates)
	r.setLatencies()
	return r
}

// median of vs (the mean of the middle two for an even count); 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// busyLoad is the load average per CPU above which the text report warns that
// the machine was not quiet.
const busyLoad = 0.5

func newReport(o options) *report {
	return &report{Settings: settings{
		Clients:    o.clients,
		SizeBytes:  o.size,
		DurationS:  o.duration.Seconds(),
		WarmupS:    o.warmup.Seconds(),
		Rounds:     o.rounds,
		CPUs:       runtime.NumCPU(),
		GoVersion:  runtime.Version(),
		ClockTicks: procfs.ClockTicks(),
		LoadAvg:    loadAvg(),
	}}
}

// finish sets the medians over the rounds.
func (p *pathResult) finish() {
	p.Ratio, p.CPUPerReqUS = roundMedians(p.Rounds, func(r roundResult) (float64, float64, bool) {
		return r.Ratio, r.CPUPerReqUS, r.cpuOK
	})
}

// roundMedians is the median ratio over rounds and, when every round has a CPU
// figure, the median CPU per request (else 0).
func roundMedians[R any](rounds []R, figures func(R) (ratio, cpuPerReq float64, cpuOK bool)) (ratio, cpuPerReq float64) {
	ratios := make([]float64, len(rounds))
	var cpus []float64
	for i, r := range rounds {
		var cpu float64
		var ok bool
		ratios[i], cpu, ok = figures(r)
		if ok {
			cpus = append(cpus, cpu)
		}
	}
	if len(cpus) == len(rounds) {
		cpuPerReq = median(cpus)
	}
	return median(ratios), cpuPerReq
}

// ratioRange is the lowest and highest ratio over the rounds.
func (p *pathResult) ratioRange() (lo, hi float64) {
	return minMax(p.Rounds, func(r roundResult) float64 { return r.Ratio })
}

// minMax is the lowest and highest of f over rs (0, 0 for none).
func minMax[R any](rs []R, f func(R) float64) (lo, hi float64) {
	for i, r := range rs {
		v := f(r)
		if i == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	return lo, hi
}

// failed reports whether anything went wrong that the numbers alone hide.
func (r *report) failed() bool {
	for _, p := range r.Paths {
		if p.Direct.Errors > 0 || p.Egressd.Errors > 0 || p.Egressd.CPUError != "" || len(p.Log.Unexpected) > 0 || len(p.Problems) > 0 ||
			(p.Idle != nil && len(p.Idle.Problems) > 0) {
			return true
		}
	}
	return r.EgressdExit != "" || r.VaultEgressdExit != ""
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // descriptions hold <port>
	return enc.Encode(r)
}

func (r *report) writeText(w io.Writer) error {
	s := r.Settings
	fmt.Fprintf(w, "egressd bench: %d clients, %d-byte responses, HTTP/1.1, %s measured after %s warm-up per run, %s, %d CPUs shared by load, upstream and egressd\n\n",
		s.Clients, s.SizeBytes, seconds(s.DurationS), seconds(s.WarmupS), roundsText(s.Rounds), s.CPUs)
	if s.LoadAvg > busyLoad*float64(s.CPUs) {
		fmt.Fprintf(w, "warning: load average %.2f at start on %d CPUs: other work competes with the bench, so figures are noisy\n\n", s.LoadAvg, s.CPUs)
	}
	if err := r.writeMain(w); err != nil {
		return err
	}
	if r.RSSError != "" {
		fmt.Fprintf(w, "\negressd peak RSS: unavailable (%s)\n", r.RSSError)
	} else {
		fmt.Fprintf(w, "\negressd peak RSS (VmHWM over the whole run): %s\n", mib(r.PeakRSSBytes))
	}
	r.writePeers(w)
	r.writeNotes(w)
	r.writeIdle(w)
	if err := r.writeDetails(w); err != nil {
		return err
	}
	r.writeProblems(w)
	return nil
}

func roundsText(n int) string {
	if n == 1 {
		return "1 round (direct, then egressd) per path"
	}
	return fmt.Sprintf("%d rounds (direct, egressd, alternated) per path, medians shown", n)
}

// writeMain is the headline table: one line per path.
func (r *report) writeMain(w io.Writer) error {
	multi := r.Settings.Rounds > 1
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	pw := r.pathWidth()
	via := "egressd"
	if r.hasPeerRows() { // a path's row is egressd, the indented ones under it peers
		via = "proxy"
	}
	fmt.Fprintf(tw, "%-*s\tdirect req/s\t%s req/s\tratio\t", pw, "path", via)
	if multi {
		fmt.Fprint(tw, "ratio min-max\t")
	}
	fmt.Fprintf(tw, "direct p50/p99\t%[1]s p50/p99\t%[1]s CPU µs/req\t%[1]s VmHWM\t\n", via)
	for _, p := range r.Paths {
		if p.Skipped != "" || p.Idle != nil {
			what, hwm := "skipped", "-"
			if p.Idle != nil {
				what, hwm = "idle: below", mib(p.PeakRSSBytes)
			}
			fmt.Fprintf(tw, "%-*s\t%s\t-\t-\t", pw, p.Path, what)
			if multi {
				fmt.Fprint(tw, "-\t")
			}
			fmt.Fprintf(tw, "-\t-\t-\t%s\t\n", hwm)
			continue
		}
		cpu := fmt.Sprintf("%.1f", p.CPUPerReqUS)
		if p.Egressd.CPUError != "" {
			cpu = "n/a"
		}
		fmt.Fprintf(tw, "%-*s\t%s\t%s\t%.2f\t", pw, p.Path,
			thousands(p.Direct.ReqPerSec), thousands(p.Egressd.ReqPerSec), p.Ratio)
		if multi {
			lo, hi := p.ratioRange()
			fmt.Fprintf(tw, "%.2f-%.2f\t", lo, hi)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", latencies(p.Direct), latencies(p.Egressd), cpu, mib(p.PeakRSSBytes))
		writePeerRows(tw, p, pw, multi)
	}
	return tw.Flush()
}

// writeNotes prints what the table implies but does not show: handshakes/s on
// new-connection paths, the credential's cost over a transform, the leaf
// cache, and every round's ratio.
func (r *report) writeNotes(w io.Writer) {
	fmt.Fprintln(w)
	for _, p := range r.Paths {
		if p.Skipped != "" {
			fmt.Fprintf(w, "%s: skipped: %s\n", p.Path, p.Skipped)
		}
	}
	for _, p := range r.Paths {
		if !p.NewConnPerRequest {
			continue
		}
		fmt.Fprintf(w, "%s: a new TCP+TLS connection per request, so %s client TLS handshakes/s direct, %s through egressd (%s egressd->upstream conns over its runs); resumed: %s direct, %s through egressd\n",
			p.Path, thousands(p.Direct.ReqPerSec), thousands(p.Egressd.ReqPerSec), thousands(float64(p.Egressd.UpstreamConns)),
			resumedShare(p.Direct), resumedShare(p.Egressd))
	}
	if c, i := r.path("credential"), r.path("intercept"); c != nil && i != nil && i.Ratio > 0 && i.Egressd.ReqPerSec > 0 {
		fmt.Fprintf(w, "credential / intercept: ratio %.2f / %.2f = %.2f, egressd req/s %.2f", c.Ratio, i.Ratio, c.Ratio/i.Ratio, c.Egressd.ReqPerSec/i.Egressd.ReqPerSec)
		if c.CPUPerReqUS > 0 && i.CPUPerReqUS > 0 {
			fmt.Fprintf(w, ", egressd CPU %.1f vs %.1f µs/req (%+.0f%%)", c.CPUPerReqUS, i.CPUPerReqUS, 100*(c.CPUPerReqUS/i.CPUPerReqUS-1))
		}
		fmt.Fprintln(w)
	}
	if v, c := r.path("vault"), r.path("credential"); v != nil && c != nil && v.Skipped == "" && c.Ratio > 0 && c.Egressd.ReqPerSec > 0 {
		fmt.Fprintf(w, "vault / credential: ratio %.2f / %.2f = %.2f, egressd req/s %.2f", v.Ratio, c.Ratio, v.Ratio/c.Ratio, v.Egressd.ReqPerSec/c.Egressd.ReqPerSec)
		if v.CPUPerReqUS > 0 && c.CPUPerReqUS > 0 {
			fmt.Fprintf(w, ", egressd CPU %.1f vs %.1f µs/req (%+.0f%%)", v.CPUPerReqUS, c.CPUPerReqUS, 100*(v.CPUPerReqUS/c.CPUPerReqUS-1))
		}
		if v.Egressd.P50US > 0 && c.Egressd.P50US > 0 {
			fmt.Fprintf(w, ", p50 %s vs %s, p99 %s vs %s", dur(v.Egressd.P50US), dur(c.Egressd.P50US), dur(v.Egressd.P99US), dur(c.Egressd.P99US))
		}
		fmt.Fprintln(w, " (a second egressd, credentials.backend vault)")
	}
	r.writeHookNote(w)
	r.writePlaceholderNote(w)
	r.writeTransparentNote(w)
	switch {
	case r.LeafCacheError != "":
		fmt.Fprintf(w, "egressd leaf cache: unavailable (%s)\n", r.LeafCacheError)
	case r.LeafCache != nil:
		fmt.Fprintf(w, "egressd leaf cache (egressd_leaf_cache_total, /metrics at the end): %s hits, %s misses; per path:", thousands(float64(r.LeafCache.Hit)), thousands(float64(r.LeafCache.Miss)))
		for _, p := range r.Paths {
			if p.LeafCache != nil {
				fmt.Fprintf(w, " %s %s/%s", p.Path, thousands(float64(p.LeafCache.Hit)), thousands(float64(p.LeafCache.Miss)))
			}
		}
		fmt.Fprintln(w)
	}
	if r.Settings.Rounds > 1 {
		fmt.Fprintln(w, "ratio per round:")
		for _, p := range r.Paths {
			if p.Skipped != "" {
				continue
			}
			fmt.Fprintf(w, "  %-*s", r.pathWidth(), p.Path)
			for _, rd := range p.Rounds {
				fmt.Fprintf(w, " %.2f", rd.Ratio)
			}
			fmt.Fprintln(w)
			writePeerRounds(w, p, r.pathWidth())
		}
	}
}

// resumedShare is how many of a run's TLS handshakes resumed a session.
func resumedShare(r runResult) string {
	return fmt.Sprintf("%s of %s", thousands(float64(r.TLSResumed)), thousands(float64(r.TLSHandshakes)))
}

func (r *report) path(name string) *pathResult {
	for i := range r.Paths {
		if r.Paths[i].Path == name {
			return &r.Paths[i]
		}
	}
	return nil
}

func mib(b int64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// pathWidth is the width of the path column, which is left-aligned by padding
// (tabwriter aligns every column one way).
func (r *report) pathWidth() int {
	w := len("path")
	for _, p := range r.Paths {
		w = max(w, len(p.Path))
		for _, pr := range p.Peers {
			w = max(w, len(peerLabel(pr)))
		}
	}
	return w
}

// writeDetails is the second table: what each run did besides its speed, so
// a reader can tell a fast run from a broken one (reconnections, errors,
// missing log lines, requests without the injected header).
func (r *report) writeDetails(w io.Writer) error {
	sum := ""
	if r.Settings.Rounds > 1 {
		sum = fmt.Sprintf(", summed over %d rounds", r.Settings.Rounds)
	}
	fmt.Fprintf(w, "\ndetails (requests include warm-up%s; conns: dials by the clients / accepts by the upstream; injected: upstream requests carrying the path's header)\n", sum)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	pw := r.pathWidth()
	fmt.Fprintf(tw, "%-*s\t%-7s\trequests\terrors\tclient conns\tupstream conns\tupstream reqs\tinjected\tmean\tmax\tegressd egress lines\tallowed 200\tleaf hit/miss\tDNS queries\t\n", pw, "path", "run")
	for _, p := range r.Paths {
		if p.Skipped != "" || p.Idle != nil {
			continue
		}
		for _, run := range p.namedRuns() { // direct, egressd, then each peer's
			lines, ok, leaf, dns := "-", "-", "-", "-"
			if run.name == "egressd" {
				lines, ok = thousands(float64(p.Log.EgressLines)), thousands(float64(p.Log.Allowed200))
				dns = thousands(float64(p.DNSQueries))
				if p.LeafCache != nil {
					leaf = thousands(float64(p.LeafCache.Hit)) + "/" + thousands(float64(p.LeafCache.Miss))
				}
			}
			fmt.Fprintf(tw, "%-*s\t%-7s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", pw, p.Path, run.name,
				thousands(float64(run.r.Total)), run.r.Errors, run.r.ClientConns, run.r.UpstreamConns,
				thousands(float64(run.r.UpstreamRequests)), thousands(float64(run.r.Transformed+run.r.Credentialed+run.r.VaultCredentialed+run.r.OAuthCredentialed)),
				dur(run.r.MeanUS), dur(run.r.MaxUS), lines, ok, leaf, dns)
		}
	}
	return tw.Flush()
}

// writeProblems lists every client error and every unexpected egressd log line,
// grouped, with a few raw lines.
func (r *report) writeProblems(w io.Writer) {
	for _, p := range r.Paths {
		for _, run := range p.namedRuns() { // direct, egressd, then each peer's
			if run.r.Errors == 0 {
				continue
			}
			fmt.Fprintf(w, "\n%s %s: %d client errors\n", p.Path, run.name, run.r.Errors)
			writeCounts(w, run.r.ErrorKinds)
		}
		if p.Egressd.CPUError != "" {
			fmt.Fprintf(w, "\n%s egressd: CPU time not measured: %s\n", p.Path, p.Egressd.CPUError)
		}
		if len(p.Problems) > 0 {
			fmt.Fprintf(w, "\n%s: injection check failed (egressd must set %s on every request)\n", p.Path, cmp.Or(p.Injects, "nothing"))
			for _, pr := range p.Problems {
				fmt.Fprintf(w, "  %s\n", pr)
			}
		}
		if len(p.Log.Unexpected) > 0 {
			fmt.Fprintf(w, "\n%s egressd: unexpected log lines\n", p.Path)
			writeCounts(w, p.Log.Unexpected)
			for _, ex := range p.Log.Examples {
				fmt.Fprintf(w, "  e.g. %s\n", ex)
			}
		}
	}
	if r.EgressdExit != "" {
		fmt.Fprintf(w, "\negressd did not exit cleanly: %s\n", r.EgressdExit)
	}
	if r.VaultEgressdExit != "" {
		fmt.Fprintf(w, "\nthe vault path's egressd did not exit cleanly: %s\n", r.VaultEgressdExit)
	}
}

// writeCounts prints a count map, largest first.
func writeCounts(w io.Writer, counts map[string]int64) {
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		if c := counts[b] - counts[a]; c != 0 {
			return int(min(max(c, -1), 1))
		}
		return strings.Compare(a, b)
	})
	for _, k := range keys {
		fmt.Fprintf(w, "  %8d  %s\n", counts[k], k)
	}
}

func latencies(r runResult) string { return dur(r.P50US) + "/" + dur(r.P99US) }

// dur prints microseconds with three significant figures in a readable unit.
func dur(us float64) string {
	d := time.Duration(us * float64(time.Microsecond))
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", us/1e3)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", us/1e3)
	default:
		return fmt.Sprintf("%.0fµs", us)
	}
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).String()
}

// thousands rounds v and groups its digits: 12345.6 -> "12,346".
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// loadAvg is the 1-minute load average, or 0 if /proc/loadavg cannot be read.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
