package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// report is everything one bench run found, printed as a table or as JSON.
type report struct {
	Settings settings     `json:"settings"`
	Paths    []pathResult `json:"paths"`
	// PeakRSSBytes is egressd's VmHWM at the end: the peak over every run.
	PeakRSSBytes int64  `json:"egressd_peak_rss_bytes"`
	RSSError     string `json:"egressd_rss_error,omitempty"`
	// EgressdExit is "" when egressd exited 0 on SIGTERM, else how it ended.
	EgressdExit string `json:"egressd_exit,omitempty"`
}

type settings struct {
	Clients    int     `json:"clients"`
	SizeBytes  int     `json:"size_bytes"`
	DurationS  float64 `json:"duration_s"`
	WarmupS    float64 `json:"warmup_s"`
	CPUs       int     `json:"cpus"`
	GoVersion  string  `json:"go_version"`
	ClockTicks int64   `json:"clock_ticks_per_s"`
	// LoadAvg is the 1-minute load average when the bench started: other
	// work on the machine makes every figure noisy, the ratio included.
	LoadAvg float64 `json:"load_avg_1m"`
}

// pathResult is one path: its direct run, its run through egressd, compared.
type pathResult struct {
	Path        string    `json:"path"`
	Description string    `json:"description"`
	Direct      runResult `json:"direct"`
	Egressd     runResult `json:"egressd"`
	// Ratio is egressd's req/s over direct req/s, from the same bench run.
	Ratio float64 `json:"ratio"`
	// CPUPerReqUS is egressd's CPU time in the window over the requests
	// completed in it.
	CPUPerReqUS float64    `json:"egressd_cpu_us_per_req"`
	Log         logSummary `json:"egressd_log"`
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
		CPUs:       runtime.NumCPU(),
		GoVersion:  runtime.Version(),
		ClockTicks: clockTicks(),
		LoadAvg:    loadAvg(),
	}}
}

func (p *pathResult) finish() {
	if p.Direct.ReqPerSec > 0 {
		p.Ratio = p.Egressd.ReqPerSec / p.Direct.ReqPerSec
	}
	if p.Egressd.Requests > 0 && p.Egressd.CPUError == "" {
		p.CPUPerReqUS = p.Egressd.CPUSeconds * 1e6 / float64(p.Egressd.Requests)
	}
}

// failed reports whether anything went wrong that the numbers alone hide.
func (r *report) failed() bool {
	for _, p := range r.Paths {
		if p.Direct.Errors > 0 || p.Egressd.Errors > 0 || p.Egressd.CPUError != "" || len(p.Log.Unexpected) > 0 {
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

func (r *report) writeText(w io.Writer) error {
	s := r.Settings
	fmt.Fprintf(w, "egressd bench: %d clients, %d-byte responses, HTTP/1.1 keep-alive, %s measured after %s warm-up per run, %d CPUs shared by load, upstream and egressd\n\n",
		s.Clients, s.SizeBytes, seconds(s.DurationS), seconds(s.WarmupS), s.CPUs)
	if s.LoadAvg > busyLoad*float64(s.CPUs) {
		fmt.Fprintf(w, "warning: load average %.2f at start on %d CPUs: other work competes with the bench, so figures are noisy\n\n", s.LoadAvg, s.CPUs)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	pw := r.pathWidth()
	fmt.Fprintf(tw, "%-*s\tdirect req/s\tegressd req/s\tratio\tdirect p50/p99\tegressd p50/p99\tegressd CPU µs/req\t\n", pw, "path")
	for _, p := range r.Paths {
		cpu := fmt.Sprintf("%.1f", p.CPUPerReqUS)
		if p.Egressd.CPUError != "" {
			cpu = "n/a"
		}
		fmt.Fprintf(tw, "%-*s\t%s\t%s\t%.2f\t%s\t%s\t%s\t\n", pw, p.Path,
			thousands(p.Direct.ReqPerSec), thousands(p.Egressd.ReqPerSec), p.Ratio,
			latencies(p.Direct), latencies(p.Egressd), cpu)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.RSSError != "" {
		fmt.Fprintf(w, "\negressd peak RSS: unavailable (%s)\n", r.RSSError)
	} else {
		fmt.Fprintf(w, "\negressd peak RSS (VmHWM over the whole run): %.1f MiB\n", float64(r.PeakRSSBytes)/(1<<20))
	}
	if err := r.writeDetails(w); err != nil {
		return err
	}
	r.writeProblems(w)
	return nil
}

// pathWidth is the width of the path column, which is left-aligned by padding
// (tabwriter aligns every column one way).
func (r *report) pathWidth() int {
	w := len("path")
	for _, p := range r.Paths {
		w = max(w, len(p.Path))
	}
	return w
}

// writeDetails is the second table: what each run did besides its speed, so
// a reader can tell a fast run from a broken one (reconnections, errors,
// missing log lines).
func (r *report) writeDetails(w io.Writer) error {
	fmt.Fprintln(w, "\ndetails (requests include warm-up; conns: dials by the clients / accepts by the upstream)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	pw := r.pathWidth()
	fmt.Fprintf(tw, "%-*s\t%-7s\trequests\terrors\tclient conns\tupstream conns\tmean\tmax\tegressd egress lines\tallowed 200\t\n", pw, "path", "run")
	for _, p := range r.Paths {
		for _, run := range []struct {
			name string
			r    runResult
		}{{"direct", p.Direct}, {"egressd", p.Egressd}} {
			lines, ok := "-", "-"
			if run.name == "egressd" {
				lines, ok = thousands(float64(p.Log.EgressLines)), thousands(float64(p.Log.Allowed200))
			}
			fmt.Fprintf(tw, "%-*s\t%-7s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", pw, p.Path, run.name,
				thousands(float64(run.r.Total)), run.r.Errors, run.r.ClientConns, run.r.UpstreamConns,
				dur(run.r.MeanUS), dur(run.r.MaxUS), lines, ok)
		}
	}
	return tw.Flush()
}

// writeProblems lists every client error and every unexpected egressd log line,
// grouped, with a few raw lines.
func (r *report) writeProblems(w io.Writer) {
	for _, p := range r.Paths {
		for _, run := range []struct {
			name string
			r    runResult
		}{{"direct", p.Direct}, {"egressd", p.Egressd}} {
			if run.r.Errors == 0 {
				continue
			}
			fmt.Fprintf(w, "\n%s %s: %d client errors\n", p.Path, run.name, run.r.Errors)
			writeCounts(w, run.r.ErrorKinds)
		}
		if p.Egressd.CPUError != "" {
			fmt.Fprintf(w, "\n%s egressd: CPU time not measured: %s\n", p.Path, p.Egressd.CPUError)
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
