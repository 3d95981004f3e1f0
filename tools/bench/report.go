package main

import (
	"encoding/json"
	"io"
	"runtime"
	"slices"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// report is everything one bench run found, printed as tables or as JSON.
type report struct {
	Settings settings     `json:"settings"`
	Paths    []pathResult `json:"paths"`
	// PeakRSSBytes is egressd's VmHWM at the end: the peak over every run.
	PeakRSSBytes   int64       `json:"egressd_peak_rss_bytes"`
	RSSError       string      `json:"egressd_rss_error,omitempty"`
	LeafCache      *leafCounts `json:"egressd_leaf_cache,omitempty"` // from /metrics at the end
	LeafCacheError string      `json:"egressd_leaf_cache_error,omitempty"`
	// EgressdExit is "" when egressd exited 0 on SIGTERM, else how it ended.
	EgressdExit string     `json:"egressd_exit,omitempty"`
	Peers       []peerInfo `json:"peers,omitempty"`
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
	// LoadAvg is the 1-minute load average at start: other work on the
	// machine makes every figure noisy.
	LoadAvg float64 `json:"load_avg_1m"`
}

// pathResult is one row: its direct runs and its runs through egressd, compared.
type pathResult struct {
	Path              string `json:"path"`
	Description       string `json:"description"`
	Skipped           string `json:"skipped,omitempty"` // why it was not measured
	Injects           string `json:"injects,omitempty"`
	NewConnPerRequest bool   `json:"new_conn_per_request,omitempty"`
	// Direct and Egressd are every round's runs together (runResult.merge):
	// req/s is the median of the rounds, latencies over all requests, counts are sums.
	Direct  runResult `json:"direct"`
	Egressd runResult `json:"egressd"`
	// Ratio and CPUPerReqUS are medians over the rounds.
	Ratio          float64       `json:"ratio"`
	CPUPerReqUS    float64       `json:"egressd_cpu_us_per_req"`
	Rounds         []roundResult `json:"rounds"`
	Log            logSummary    `json:"egressd_log"`
	LeafCache      *leafCounts   `json:"egressd_leaf_cache,omitempty"` // growth over the row's runs
	LeafCacheError string        `json:"egressd_leaf_cache_error,omitempty"`
	DNSQueries     int64         `json:"dns_queries"`
	PeakRSSBytes   int64         `json:"egressd_peak_rss_after_bytes"`
	// Problems are failed checks of what reached the far side.
	Problems []string       `json:"problems,omitempty"`
	Attack   *attackSummary `json:"attack,omitempty"`
	Node     *nodeSummary   `json:"node,omitempty"`
	// Peers are the peers' rows, in -peers order; NotApplicable: the peer does
	// not intercept, so it has no figures on this path.
	Peers         []pathResult `json:"peers,omitempty"`
	NotApplicable bool         `json:"not_applicable,omitempty"`
}

// roundResult is one direct run and the proxy's run after it.
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

func newReport(o options) *report {
	loadAvg, _ := procfs.LoadAvg() // 0 when unknown: no warning
	return &report{Settings: settings{
		Clients: o.clients, SizeBytes: o.size, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds(),
		Rounds: o.rounds, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		ClockTicks: procfs.ClockTicks(), LoadAvg: loadAvg,
	}}
}

// finish sets the medians over the rounds: the ratio, each side's req/s and,
// when every round has a CPU figure, the CPU per request (else 0).
func (p *pathResult) finish() {
	var ratios, directs, vias, cpus []float64
	for _, r := range p.Rounds {
		ratios, directs, vias = append(ratios, r.Ratio), append(directs, r.DirectReqPerSec), append(vias, r.EgressdReqPerSec)
		if r.cpuOK {
			cpus = append(cpus, r.CPUPerReqUS)
		}
	}
	p.Ratio, p.Direct.ReqPerSec, p.Egressd.ReqPerSec = median(ratios), median(directs), median(vias)
	if len(cpus) == len(p.Rounds) {
		p.CPUPerReqUS = median(cpus)
	}
}

// ratioRange is the lowest and highest ratio over rounds.
func ratioRange(rounds []roundResult) (lo, hi float64) {
	for i, r := range rounds {
		if i == 0 || r.Ratio < lo {
			lo = r.Ratio
		}
		hi = max(hi, r.Ratio)
	}
	return lo, hi
}

// failed reports whether anything went wrong that the numbers alone hide.
func (r *report) failed() bool {
	for _, p := range r.Paths {
		if p.Direct.Errors > 0 || p.Egressd.Errors > 0 || p.Egressd.CPUError != "" || len(p.Log.Unexpected) > 0 || len(p.Problems) > 0 {
			return true
		}
	}
	return r.EgressdExit != ""
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // descriptions hold <port>
	return enc.Encode(r)
}

func (r *report) path(name string) *pathResult {
	if i := slices.IndexFunc(r.Paths, func(p pathResult) bool { return p.Path == name }); i >= 0 {
		return &r.Paths[i]
	}
	return nil
}

// namedRun is one side of a row in the details and problems lists.
type namedRun struct {
	name string
	r    runResult
}

// namedRuns is the row's direct and egressd runs, then each measured peer's.
func (p *pathResult) namedRuns() []namedRun {
	runs := []namedRun{{"direct", p.Direct}, {"egressd", p.Egressd}}
	for _, pr := range p.Peers {
		if pr.Skipped == "" {
			runs = append(runs, namedRun{pr.Path, pr.Egressd})
		}
	}
	return runs
}
