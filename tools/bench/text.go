package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// busyLoad is the load average per CPU above which the report warns that the
// machine was not quiet.
const busyLoad = 0.5

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
	r.writeNode(w)
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

// table is the main table's writer: one row per path, its peers' indented
// under it, the ratio range only with several rounds.
type table struct {
	tw    *tabwriter.Writer
	pw    int // the path column, left-aligned by padding (tabwriter aligns one way)
	multi bool
}

// row writes label and the cells direct req/s, proxy req/s, ratio, ratio
// range, direct and proxy latencies, CPU and VmHWM.
func (t table) row(label string, cells ...string) {
	if !t.multi {
		cells = slices.Delete(cells, 3, 4)
	}
	fmt.Fprintf(t.tw, "%-*s\t%s\t\n", t.pw, label, strings.Join(cells, "\t"))
}

// figures writes p's measured row; a peer's has no direct cells.
func (t table) figures(label string, p pathResult, direct, directLat string) {
	lo, hi := ratioRange(p.Rounds)
	cpu := fmt.Sprintf("%.1f", p.CPUPerReqUS)
	if p.Egressd.CPUError != "" {
		cpu = "n/a"
	}
	t.row(label, direct, thousands(p.Egressd.ReqPerSec), fmt.Sprintf("%.2f", p.Ratio), fmt.Sprintf("%.2f-%.2f", lo, hi),
		directLat, latencies(p.Egressd), cpu, mib(p.PeakRSSBytes))
}

func (r *report) writeMain(w io.Writer) error {
	t := table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight), pw: r.pathWidth(), multi: r.Settings.Rounds > 1}
	via := "egressd"
	if slices.ContainsFunc(r.Paths, func(p pathResult) bool { return len(p.Peers) > 0 }) {
		via = "proxy" // a path's row is egressd's, the indented ones its peers'
	}
	t.row("path", "direct req/s", via+" req/s", "ratio", "ratio min-max", "direct p50/p99", via+" p50/p99", via+" CPU µs/req", via+" VmHWM")
	for _, p := range r.Paths {
		if p.Skipped != "" {
			t.row(p.Path, "skipped", "-", "-", "-", "-", "-", "-", "-")
		} else {
			t.figures(p.Path, p, thousands(p.Direct.ReqPerSec), latencies(p.Direct))
		}
		for _, pr := range p.Peers { // "—": it does not intercept; reasons under the table
			switch {
			case pr.NotApplicable:
				t.row("  "+pr.Path, "", "—", "—", "—", "", "—", "—", "—")
			case pr.Skipped != "":
				t.row("  "+pr.Path, "", "skipped", "-", "-", "", "-", "-", "-")
			default:
				t.figures("  "+pr.Path, pr, "", "")
			}
		}
	}
	return t.tw.Flush()
}

// writePeers says, under the table, what the peer rows are: each peer's peak
// RSS, why one was skipped or has "—", and how one did not exit cleanly.
func (r *report) writePeers(w io.Writer) {
	if len(r.Peers) == 0 {
		return
	}
	fmt.Fprintln(w, "peers (indented rows): the same load through each, every round right after egressd's run; ratio against that round's direct run")
	for _, pi := range r.Peers {
		if pi.Skipped != "" {
			fmt.Fprintf(w, "  %s: skipped: %s\n", pi.Peer, pi.Skipped)
		} else {
			fmt.Fprintf(w, "  %s peak RSS (VmHWM over the whole run): %s\n", pi.Peer, mib(pi.PeakRSSBytes))
		}
		var na []string
		why := ""
		for _, p := range r.Paths {
			for _, pr := range p.Peers {
				if pr.Path == pi.Peer && pr.NotApplicable {
					na, why = append(na, p.Path), pr.Skipped
				}
			}
		}
		if len(na) > 0 {
			fmt.Fprintf(w, "  %s on %s: —: %s\n", pi.Peer, strings.Join(na, ", "), why)
		}
		if pi.Exit != "" {
			fmt.Fprintf(w, "  %s did not exit cleanly: %s\n", pi.Peer, pi.Exit)
		}
	}
}

// writeNotes prints what the table implies but does not show: skipped paths,
// handshakes/s, rows compared with each other, the leaf cache, every round's ratio.
func (r *report) writeNotes(w io.Writer) {
	fmt.Fprintln(w)
	for _, p := range r.Paths {
		switch {
		case p.Skipped != "":
			fmt.Fprintf(w, "%s: skipped: %s\n", p.Path, p.Skipped)
		case p.NewConnPerRequest:
			fmt.Fprintf(w, "%s: a new TCP+TLS connection per request, so %s client TLS handshakes/s direct, %s through egressd (%s egressd->upstream conns over its runs); resumed: %s direct, %s through egressd\n",
				p.Path, thousands(p.Direct.ReqPerSec), thousands(p.Egressd.ReqPerSec), thousands(p.Egressd.UpstreamConns),
				resumedShare(p.Direct), resumedShare(p.Egressd))
		}
	}
	for _, c := range comparisons {
		r.compareNote(w, c[0], c[1], c[2])
	}
	r.writeAttackNote(w)
	r.writeLeafNote(w)
	if r.Settings.Rounds > 1 {
		fmt.Fprintln(w, "ratio per round:")
		for _, p := range r.Paths {
			if p.Skipped == "" {
				writeRounds(w, r.pathWidth(), p.Path, p.Rounds)
				for _, pr := range p.Peers {
					if pr.Skipped == "" {
						writeRounds(w, r.pathWidth(), "  "+pr.Path, pr.Rounds)
					}
				}
			}
		}
	}
}

// comparisons are the rows compared with each other: a, b and what a adds.
var comparisons = [][3]string{
	{"credential", "intercept", ""},
	{"vault", "credential", " (a second egressd, credentials.backend vault)"},
	{"hook", hookOtherRow, fmt.Sprintf(" (a signed pre_tool_execution call vs the same %d-byte POST to a URL of the same entry that is no hook's)", hookBodySize)},
	{placeholderRow, "credential", fmt.Sprintf(" (a %d-byte JSON body's placeholder replaced vs an injected Authorization on a GET)", placeholderBodySize)},
	{awsRow, "credential", " (a GET signed again with SigV4 vs an injected Authorization)"},
	{"transparent", transparentExplicitRow, " (one egressd, spliced TLS to " + transparentHost + ":" + standInPort + ": from the sandbox namespace via the DNAT vs CONNECT from outside)"},
	{"node-churn", "node-quiet", " (the same sandbox's GETs while others churn)"},
	{fmt.Sprintf("node-%d", nodeSandboxes), "node-1", " (one sandbox's GETs on a node serving 1,000 vs one)"},
}

func writeRounds(w io.Writer, pw int, label string, rounds []roundResult) {
	fmt.Fprintf(w, "  %-*s", pw, label)
	for _, rd := range rounds {
		fmt.Fprintf(w, " %.2f", rd.Ratio)
	}
	fmt.Fprintln(w)
}

// compareNote compares row a with row b, both through egressd: what a costs
// over b.
func (r *report) compareNote(w io.Writer, a, b, suffix string) {
	x, y := r.path(a), r.path(b)
	if x == nil || y == nil || x.Skipped != "" || y.Ratio <= 0 || y.Egressd.ReqPerSec <= 0 {
		return
	}
	fmt.Fprintf(w, "%s / %s: ratio %.2f / %.2f = %.2f, egressd req/s %.2f", a, b, x.Ratio, y.Ratio, x.Ratio/y.Ratio, x.Egressd.ReqPerSec/y.Egressd.ReqPerSec)
	if x.CPUPerReqUS > 0 && y.CPUPerReqUS > 0 {
		fmt.Fprintf(w, ", egressd CPU %.1f vs %.1f µs/req (%+.0f%%)", x.CPUPerReqUS, y.CPUPerReqUS, 100*(x.CPUPerReqUS/y.CPUPerReqUS-1))
	}
	if x.Egressd.P50US > 0 && y.Egressd.P50US > 0 {
		fmt.Fprintf(w, ", p50 %s vs %s, p99 %s vs %s", dur(x.Egressd.P50US), dur(y.Egressd.P50US), dur(x.Egressd.P99US), dur(y.Egressd.P99US))
	}
	fmt.Fprintln(w, suffix)
}

func (r *report) writeLeafNote(w io.Writer) {
	switch {
	case r.LeafCacheError != "":
		fmt.Fprintf(w, "egressd leaf cache: unavailable (%s)\n", r.LeafCacheError)
	case r.LeafCache != nil:
		fmt.Fprintf(w, "egressd leaf cache (egressd_leaf_cache_total, /metrics at the end): %s hits, %s misses; per path in the details' leaf hit/miss column\n",
			thousands(r.LeafCache.Hit), thousands(r.LeafCache.Miss))
	}
}

// resumedShare is how many of a run's TLS handshakes resumed a session.
func resumedShare(r runResult) string {
	return fmt.Sprintf("%s of %s", thousands(r.TLSResumed), thousands(r.TLSHandshakes))
}

func (r *report) pathWidth() int {
	w := len("path")
	for _, p := range r.Paths {
		w = max(w, len(p.Path))
		for _, pr := range p.Peers {
			w = max(w, len("  "+pr.Path))
		}
	}
	return w
}

// writeDetails is the second table: what each run did besides its speed, so
// a reader can tell a fast run from a broken one.
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
		if p.Skipped != "" {
			continue
		}
		for _, run := range p.namedRuns() {
			lines, ok, leaf, dns := "-", "-", "-", "-"
			if run.name == "egressd" {
				lines, ok, dns = thousands(p.Log.EgressLines), thousands(p.Log.Allowed200), thousands(p.DNSQueries)
				if p.LeafCache != nil {
					leaf = thousands(p.LeafCache.Hit) + "/" + thousands(p.LeafCache.Miss)
				}
			}
			x := run.r
			fmt.Fprintf(tw, "%-*s\t%-7s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", pw, p.Path, run.name,
				thousands(x.Total), x.Errors, x.ClientConns, x.UpstreamConns,
				thousands(x.UpstreamRequests), thousands(total(x.Injected)),
				dur(x.MeanUS), dur(x.MaxUS), lines, ok, leaf, dns)
		}
	}
	return tw.Flush()
}

// writeProblems lists every client error and every unexpected egressd log
// line, grouped, with a few raw lines.
func (r *report) writeProblems(w io.Writer) {
	for _, p := range r.Paths {
		for _, run := range p.namedRuns() {
			if run.r.Errors > 0 {
				fmt.Fprintf(w, "\n%s %s: %d client errors\n", p.Path, run.name, run.r.Errors)
				writeCounts(w, run.r.ErrorKinds)
			}
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
}

// writeCounts prints a count map, largest first.
func writeCounts(w io.Writer, counts map[string]int64) {
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b))
	})
	for _, k := range keys {
		fmt.Fprintf(w, "  %8d  %s\n", counts[k], k)
	}
}

func total(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
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

func seconds(s float64) string { return time.Duration(s * float64(time.Second)).String() }

// thousands rounds v and groups its digits: 12345.6 -> "12,346".
func thousands[N int64 | float64](v N) string {
	s := strconv.FormatInt(int64(float64(v)+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func mib(b int64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// verdict says whether a goal was met.
func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
