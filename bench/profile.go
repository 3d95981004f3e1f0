package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// -profile DIR: egressd's CPU profile and allocation profile over the measured
// window of each path's first run through it, fetched from net/http/pprof on
// its admin listener (admin.pprof, which the generated config sets only with
// -profile: a CPU profile costs CPU). After the last path, `go tool pprof -top`
// summarises each CPU profile: the top functions by flat%, and by cum% without
// runtime.* and the goroutines' root functions.

const (
	// profileSlack is how long a profile fetch may take beyond its seconds.
	profileSlack = 15 * time.Second
	// maxProfileBytes bounds a fetched profile (they are tens of KiB).
	maxProfileBytes = 64 << 20
	// pprofTimeout bounds one `go tool pprof` run; the first one of a Go
	// installation also builds the tool (about 15 s on a quiet machine).
	pprofTimeout = 5 * time.Minute
	// profileTopN is how many functions the report shows per list.
	profileTopN = 3
	// profileCumScan is how many functions by cum% are read to find
	// profileTopN that are neither runtime.* nor a goroutine's root.
	profileCumScan = 60
)

// adminPprof is whether writeConfig's egressd configs serve net/http/pprof
// (admin.pprof): set by run from -profile, before any egressd starts.
var adminPprof bool

// adminPprofLine is the admin section's pprof line, or "" without -profile.
func adminPprofLine() string {
	if !adminPprof {
		return ""
	}
	return "  pprof: true                        # -profile: /debug/pprof/ on this listener (costs CPU while profiling)"
}

// prepareProfiles makes -profile's directory (absolute, created) and turns
// admin.pprof on in the generated configs.
func prepareProfiles(o *options) error {
	if o.profile == "" {
		return nil
	}
	abs, err := filepath.Abs(o.profile)
	if err != nil {
		return fmt.Errorf("-profile: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return fmt.Errorf("-profile: %w", err)
	}
	o.profile, adminPprof = abs, true
	return nil
}

// profileResult is one path's profiles: where they are and what they show.
type profileResult struct {
	// Skipped says why the path was not profiled.
	Skipped string `json:"skipped,omitempty"`
	// Seconds is how long each profile ran, from the start of the window.
	Seconds    int    `json:"seconds,omitempty"`
	CPUFile    string `json:"cpu_file,omitempty"`
	AllocsFile string `json:"allocs_file,omitempty"` // a delta: allocations during the same seconds
	// CPUTotal is the CPU time the profile sampled ("2.46s").
	CPUTotal string `json:"cpu_total,omitempty"`
	// TopFlat are the functions with the most CPU time of their own; TopCum
	// those with the most including what they call, without runtime.* and the
	// functions goroutines start in (which have every sample of theirs).
	TopFlat []profileEntry `json:"cpu_top_flat,omitempty"`
	TopCum  []profileEntry `json:"cpu_top_cum,omitempty"`
	// AllocsTotal and AllocsTop are alloc_space: bytes allocated in the window.
	AllocsTotal string         `json:"allocs_total,omitempty"`
	AllocsTop   []profileEntry `json:"allocs_top_flat,omitempty"`
	// Errors are fetches or summaries that failed.
	Errors []string `json:"errors,omitempty"`
}

// profileEntry is one line of `go tool pprof -top`.
type profileEntry struct {
	Function string  `json:"function"`
	Flat     string  `json:"flat"`
	FlatPct  float64 `json:"flat_pct"`
	Cum      string  `json:"cum"`
	CumPct   float64 `json:"cum_pct"`
}

// profileFetch is the profiles of one run, being fetched.
type profileFetch struct {
	done chan struct{}
	res  profileResult
}

// startProfile starts, with -profile and on round 0 only, fetching e's CPU
// profile and allocation delta over the measured window of a run that starts
// now (after o.warmup, for o.duration rounded down to whole seconds, at least
// one). It returns nil otherwise. The fetches are bounded by their seconds plus
// profileSlack.
func startProfile(ctx context.Context, e *egressd, name string, o options, round int) *profileFetch {
	if o.profile == "" || round != 0 {
		return nil
	}
	secs := profileSeconds(o.duration)
	f := &profileFetch{done: make(chan struct{}), res: profileResult{
		Seconds:    secs,
		CPUFile:    filepath.Join(o.profile, name+".cpu.pprof"),
		AllocsFile: filepath.Join(o.profile, name+".allocs.pprof"),
	}}
	from := time.Now().Add(o.warmup)
	go func() {
		defer close(f.done)
		if err := sleepUntil(ctx, from); err != nil {
			f.res.Errors = append(f.res.Errors, "profile: "+err.Error())
			return
		}
		q := "?seconds=" + strconv.Itoa(secs)
		errc := make(chan error, 1)
		go func() { errc <- fetchProfile(ctx, e.adminAddr, "/debug/pprof/allocs"+q, f.res.AllocsFile, secs) }()
		cpuErr := fetchProfile(ctx, e.adminAddr, "/debug/pprof/profile"+q, f.res.CPUFile, secs)
		allocErr := <-errc
		if cpuErr != nil {
			f.res.CPUFile = ""
			f.res.Errors = append(f.res.Errors, "CPU profile: "+cpuErr.Error())
		}
		if allocErr != nil {
			f.res.AllocsFile = ""
			f.res.Errors = append(f.res.Errors, "allocs profile: "+allocErr.Error())
		}
	}()
	return f
}

// wait returns the fetched profiles once both fetches have ended.
func (f *profileFetch) wait() *profileResult {
	<-f.done
	r := f.res
	return &r
}

// profileSeconds is the duration in whole seconds, rounded down, at least 1.
func profileSeconds(d time.Duration) int {
	return max(1, int(d/time.Second))
}

// fetchProfile GETs path from egressd's admin listener (a loopback literal)
// into file; the handler answers after secs seconds.
func fetchProfile(ctx context.Context, addr, path, file string, secs int) error {
	if err := loopbackOnly(addr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+profileSlack)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxProfileBytes+1))
	switch {
	case err != nil:
		return err
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("GET %s: 404: this egressd does not serve /debug/pprof/ (admin.pprof; make build)", path)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, truncate(string(b), 200))
	case len(b) > maxProfileBytes:
		return fmt.Errorf("GET %s: more than %d bytes", path, maxProfileBytes)
	}
	return os.WriteFile(file, b, 0o644)
}

// summarizeProfiles runs `go tool pprof` on every profile fetched, once every
// path has run (so that it competes with no measurement), and notes the rows
// that were not profiled.
func summarizeProfiles(ctx context.Context, rep *report, o options, stderr io.Writer) {
	if o.profile == "" {
		return
	}
	goBin, goErr := goCommand()
	announced := false
	for i := range rep.Paths {
		p := &rep.Paths[i]
		switch {
		case p.Skipped != "":
			continue
		case p.Profile == nil && p.Idle != nil:
			p.Profile = &profileResult{Skipped: "no load window to profile (idle tunnels)"}
			continue
		case p.Profile == nil:
			p.Profile = &profileResult{Skipped: "a path with its own runs (transparent.go: its egressd runs in namespaces of its own), which -profile does not cover"}
			continue
		}
		if goErr != nil {
			p.Profile.Errors = append(p.Profile.Errors, "go tool pprof: "+goErr.Error())
			continue
		}
		if !announced {
			fmt.Fprintf(stderr, "bench: -profile: go tool pprof on the profiles in %s (its first run builds it)\n", o.profile)
			announced = true
		}
		p.Profile.summarize(ctx, goBin)
	}
}

// summarize fills the top lists from the fetched files.
func (r *profileResult) summarize(ctx context.Context, goBin string) {
	fail := func(what string, err error) { r.Errors = append(r.Errors, what+": "+err.Error()) }
	if r.CPUFile != "" {
		if out, err := runPprof(ctx, goBin, "-top", "-nodecount="+strconv.Itoa(profileTopN), r.CPUFile); err != nil {
			fail("CPU top", err)
		} else {
			r.CPUTotal, r.TopFlat = parsePprofTop(out)
		}
		roots := map[string]bool{}
		if out, err := runPprof(ctx, goBin, "-traces", r.CPUFile); err != nil {
			fail("CPU traces (goroutine roots)", err)
		} else {
			roots = goroutineRoots(out)
		}
		if out, err := runPprof(ctx, goBin, "-top", "-cum", "-nodecount="+strconv.Itoa(profileCumScan), r.CPUFile); err != nil {
			fail("CPU top by cum", err)
		} else {
			_, cum := parsePprofTop(out)
			r.TopCum = topCum(cum, roots, profileTopN)
		}
	}
	if r.AllocsFile != "" {
		if out, err := runPprof(ctx, goBin, "-top", "-sample_index=alloc_space", "-nodecount="+strconv.Itoa(profileTopN), r.AllocsFile); err != nil {
			fail("allocs top", err)
		} else {
			r.AllocsTotal, r.AllocsTop = parsePprofTop(out)
		}
	}
}

// goCommand is the go command that runs pprof: the one on PATH, else
// $GOROOT/bin/go.
func goCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no go command on PATH or in $GOROOT/bin")
}

// runPprof runs `go tool pprof args...` in the profile's directory (outside
// any module, so that the go command reads no go.mod) and returns its stdout.
func runPprof(ctx context.Context, goBin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, pprofTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, append([]string{"tool", "pprof"}, args...)...)
	cmd.Dir = filepath.Dir(args[len(args)-1])
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%w: %s", err, lastLine(stderr.String()))
	}
	return stdout.String(), nil
}

// parsePprofTop reads the output of `go tool pprof -top`: the total the
// profile accounts for (from "Showing nodes accounting for X, P% of T total")
// and the table's rows, in order. Function names may hold spaces.
func parsePprofTop(out string) (total string, entries []profileEntry) {
	inTable := false
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\r\n")
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Showing nodes accounting for "); ok {
			if i := strings.LastIndex(rest, " of "); i >= 0 {
				total = strings.TrimSuffix(rest[i+len(" of "):], " total")
			}
			continue
		}
		f := strings.Fields(line)
		if !inTable {
			inTable = len(f) == 5 && f[0] == "flat" && f[1] == "flat%" && f[3] == "cum" && f[4] == "cum%"
			continue
		}
		if len(f) < 6 {
			continue
		}
		flatPct, err1 := parsePct(f[1])
		cumPct, err2 := parsePct(f[4])
		if err1 != nil || err2 != nil {
			continue
		}
		entries = append(entries, profileEntry{
			Function: afterFields(line, 5),
			Flat:     f[0], FlatPct: flatPct,
			Cum: f[3], CumPct: cumPct,
		})
	}
	return total, entries
}

func parsePct(s string) (float64, error) {
	v, ok := strings.CutSuffix(s, "%")
	if !ok {
		return 0, errors.New("not a percentage: " + s)
	}
	return strconv.ParseFloat(v, 64)
}

// afterFields is what follows the first n space-separated fields of line.
func afterFields(line string, n int) string {
	s := line
	for range n {
		s = strings.TrimLeft(s, " \t")
		i := strings.IndexAny(s, " \t")
		if i < 0 {
			return ""
		}
		s = s[i:]
	}
	return strings.TrimSpace(s)
}

// traceSeparator starts every sample of `go tool pprof -traces`.
const traceSeparator = "-----------+-------------------------------------------------------"

// goroutineRoots reads `go tool pprof -traces`: each sample is a value and its
// leaf function on one line, then its callers, one per line, up to the stack's
// root: the function its goroutine was started with (CPU profiles leave out
// runtime.goexit below it; a heap profile's stacks end in it, and it is
// dropped), whose cum% is all of that goroutine's samples, and says little.
func goroutineRoots(out string) map[string]bool {
	roots := map[string]bool{}
	var frames []string
	flush := func() {
		if n := len(frames); n > 0 && frames[n-1] == "runtime.goexit" {
			frames = frames[:n-1]
		}
		if n := len(frames); n > 0 {
			roots[frames[n-1]] = true
		}
		frames = frames[:0]
	}
	started := false
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(line) == traceSeparator {
			flush()
			started = true
			continue
		}
		if !started || strings.TrimSpace(line) == "" {
			continue
		}
		if len(frames) == 0 {
			// The sample's first line: its value, then its leaf. Lines
			// before it (labels: "key:  value") are skipped.
			f := strings.Fields(line)
			if len(f) < 2 || f[0] == "" || f[0][0] < '0' || f[0][0] > '9' {
				continue
			}
			frames = append(frames, cleanFrame(afterFields(line, 1)))
			continue
		}
		frames = append(frames, cleanFrame(line))
	}
	flush()
	return roots
}

func cleanFrame(s string) string {
	return strings.TrimSuffix(strings.TrimSpace(s), " (inline)")
}

// topCum is the first n of entries (sorted by cum) that are neither runtime.*
// nor in roots.
func topCum(entries []profileEntry, roots map[string]bool, n int) []profileEntry {
	var out []profileEntry
	for _, e := range entries {
		name := cleanFrame(e.Function)
		if strings.HasPrefix(name, "runtime.") || roots[name] {
			continue
		}
		out = append(out, e)
		if len(out) == n {
			break
		}
	}
	return out
}

// writeProfiles prints each path's profiles and their top functions.
func (r *report) writeProfiles(w io.Writer) {
	if r.Settings.ProfileDir == "" {
		return
	}
	fmt.Fprintf(w, "\nprofiles (-profile %s: egressd's CPU profile and allocations over each path's first measured window through it; go tool pprof -top <file> for more):\n", r.Settings.ProfileDir)
	pw := r.pathWidth()
	for _, p := range r.Paths {
		pr := p.Profile
		switch {
		case p.Skipped != "":
			continue
		case pr == nil:
			fmt.Fprintf(w, "  %-*s  not profiled\n", pw, p.Path)
			continue
		case pr.Skipped != "":
			fmt.Fprintf(w, "  %-*s  not profiled: %s\n", pw, p.Path, pr.Skipped)
			continue
		}
		indent := strings.Repeat(" ", pw+4)
		files := []string{}
		for _, f := range []string{pr.CPUFile, pr.AllocsFile} {
			if f != "" {
				files = append(files, filepath.Base(f))
			}
		}
		fmt.Fprintf(w, "  %-*s  %d s: %s", pw, p.Path, pr.Seconds, strings.Join(files, ", "))
		if pr.CPUTotal != "" {
			fmt.Fprintf(w, "; %s of CPU samples", pr.CPUTotal)
		}
		fmt.Fprintln(w)
		if len(pr.TopFlat) > 0 {
			fmt.Fprintf(w, "%sCPU top by flat%%: %s\n", indent, entriesText(pr.TopFlat, false))
		}
		if len(pr.TopCum) > 0 {
			fmt.Fprintf(w, "%sCPU top by cum%% (no runtime.*, no goroutine roots): %s\n", indent, entriesText(pr.TopCum, true))
		}
		if len(pr.AllocsTop) > 0 {
			fmt.Fprintf(w, "%sallocated (%s in the window) top by flat%%: %s\n", indent, pr.AllocsTotal, entriesText(pr.AllocsTop, false))
		}
		for _, e := range pr.Errors {
			fmt.Fprintf(w, "%sfailed: %s\n", indent, e)
		}
	}
}

// entriesText is "12.3% pkg.F, 4.5% pkg.G", by flat% or cum%.
func entriesText(es []profileEntry, cum bool) string {
	parts := make([]string, len(es))
	for i, e := range es {
		pct := e.FlatPct
		if cum {
			pct = e.CumPct
		}
		parts[i] = fmt.Sprintf("%.1f%% %s", pct, e.Function)
	}
	return strings.Join(parts, ", ")
}
