package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// pprofTopCPU is `go tool pprof -top -cum -nodecount=8` of a CPU profile of
// egressd on the plain path, with a name holding a space added.
const pprofTopCPU = `File: egressd
Build ID: 236682a281f33f146363b98e7d2d778922a5938c
Type: cpu
Time: 2026-11-29 23:05:41 UTC
Duration: 3.07s, Total samples = 1230ms (40.02%)
Showing nodes accounting for 490ms, 39.84% of 1230ms total
Dropped 16 nodes (cum <= 6.15ms)
Showing top 8 nodes out of 213
      flat  flat%   sum%        cum   cum%
         0     0%     0%      630ms 51.22%  github.com/egressd/egressd/internal/proxy.(*Server).serveConn.func1
         0     0%     0%      630ms 51.22%  github.com/egressd/egressd/internal/proxy.(*conn).serve
         0     0%     0%      600ms 48.78%  runtime.mcall
         0     0%     0%      530ms 43.09%  github.com/egressd/egressd/internal/proxy.(*conn).handle
     490ms 39.84% 39.84%      490ms 39.84%  internal/runtime/syscall/linux.Syscall6
         0     0% 39.84%      450ms 36.59%  internal/poll.ignoringEINTRIO (inline)
      10ms  0.81% 40.65%       20ms  1.63%  type:.eq.[2]interface {}
`

func TestParsePprofTop(t *testing.T) {
	total, es := parsePprofTop(pprofTopCPU)
	if total != "1230ms" {
		t.Errorf("total = %q, want 1230ms", total)
	}
	if len(es) != 7 {
		t.Fatalf("%d entries, want 7: %+v", len(es), es)
	}
	want := []profileEntry{
		{Function: "github.com/egressd/egressd/internal/proxy.(*Server).serveConn.func1", Flat: "0", FlatPct: 0, Cum: "630ms", CumPct: 51.22},
		{Function: "internal/runtime/syscall/linux.Syscall6", Flat: "490ms", FlatPct: 39.84, Cum: "490ms", CumPct: 39.84},
		{Function: "internal/poll.ignoringEINTRIO (inline)", Flat: "0", FlatPct: 0, Cum: "450ms", CumPct: 36.59},
		{Function: "type:.eq.[2]interface {}", Flat: "10ms", FlatPct: 0.81, Cum: "20ms", CumPct: 1.63},
	}
	for i, j := range []int{0, 4, 5, 6} {
		if es[j] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", j, es[j], want[i])
		}
	}

	// An allocs profile: sizes, and a total without a CPU percentage.
	allocs := `Type: alloc_space
Duration: 3.01s, Total samples = 117.89MB 
Showing nodes accounting for 41.51MB, 35.21% of 117.89MB total
      flat  flat%   sum%        cum   cum%
   21.50MB 18.24% 18.24%    21.50MB 18.24%  net/textproto.readMIMEHeader
      10MB  8.49% 26.73%       10MB  8.49%  net/http.(*Request).WithContext
`
	total, es = parsePprofTop(allocs)
	if total != "117.89MB" || len(es) != 2 || es[0].Function != "net/textproto.readMIMEHeader" || es[0].FlatPct != 18.24 || es[1].Flat != "10MB" {
		t.Errorf("allocs: total %q, entries %+v", total, es)
	}

	// An empty profile, or no table at all: no entries.
	for _, out := range []string{"Showing nodes accounting for 0, 0% of 0 total\n      flat  flat%   sum%        cum   cum%\n", "", "some error\n"} {
		if _, es := parsePprofTop(out); len(es) != 0 {
			t.Errorf("parsePprofTop(%q) = %+v", out, es)
		}
	}
}

func TestTopCumSkipsRuntimeAndRoots(t *testing.T) {
	traces := `File: egressd
Type: cpu
-----------+-------------------------------------------------------
      10ms   github.com/rs/zerolog/internal/json.Encoder.AppendString
             github.com/egressd/egressd/internal/proxy.(*conn).serve
             github.com/egressd/egressd/internal/proxy.(*Server).serveConn.func1
-----------+-------------------------------------------------------
      20ms   internal/runtime/syscall/linux.Syscall6
             runtime.netpoll
             runtime.mcall
-----------+-------------------------------------------------------
         bytes:  512
      10ms   net/http.ReadResponse
             net/http.(*persistConn).readLoop (inline)
             runtime.goexit
-----------+-------------------------------------------------------
`
	roots := goroutineRoots(traces)
	for _, want := range []string{"github.com/egressd/egressd/internal/proxy.(*Server).serveConn.func1", "runtime.mcall", "net/http.(*persistConn).readLoop"} {
		if !roots[want] {
			t.Errorf("roots lack %s: %v", want, roots)
		}
	}
	if len(roots) != 3 {
		t.Errorf("roots = %v, want 3", roots)
	}
	_, es := parsePprofTop(pprofTopCPU)
	got := topCum(es, roots, 3)
	var names []string
	for _, e := range got {
		names = append(names, e.Function)
	}
	want := "github.com/egressd/egressd/internal/proxy.(*conn).serve, github.com/egressd/egressd/internal/proxy.(*conn).handle, internal/runtime/syscall/linux.Syscall6"
	if strings.Join(names, ", ") != want {
		t.Errorf("topCum = %s\nwant     %s", strings.Join(names, ", "), want)
	}
}

func TestProfileSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{500 * time.Millisecond, 1}, {time.Second, 1}, {3900 * time.Millisecond, 3}, {4 * time.Second, 4}} {
		if got := profileSeconds(tc.d); got != tc.want {
			t.Errorf("profileSeconds(%s) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// TestAdminPprofConfig: admin.pprof is in the generated config only with -profile.
func TestAdminPprofConfig(t *testing.T) {
	up := &upstream{httpAddr: "127.0.0.1:1080", tlsAddr: "127.0.0.1:1443", caPEM: []byte("pem")}
	for _, on := range []bool{false, true} {
		adminPprof = on
		path, err := writeConfig(t.TempDir(), up, "127.0.0.1:5353", "", benchMaxConnections)
		adminPprof = false
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b := string(raw)
		if got := strings.Contains(b, "\n  pprof: true "); got != on {
			t.Errorf("-profile %v: admin.pprof in the config = %v:\n%s", on, got, b)
		}
		if !strings.Contains(b, "\nlimits:\n  max_connections: 30000 ") {
			t.Errorf("config lacks limits.max_connections 30000:\n%s", b)
		}
	}
}

func TestWriteProfiles(t *testing.T) {
	r := &report{Settings: settings{Clients: 64, SizeBytes: 1024, DurationS: 3, Rounds: 1, CPUs: 2, ProfileDir: "/tmp/prof"}}
	_, es := parsePprofTop(pprofTopCPU)
	r.Paths = []pathResult{
		{Path: "plain", Profile: &profileResult{Seconds: 3, CPUFile: "/tmp/prof/plain.cpu.pprof", AllocsFile: "/tmp/prof/plain.allocs.pprof",
			CPUTotal: "1230ms", TopFlat: es[4:7], TopCum: es[1:2], AllocsTotal: "117.89MB", AllocsTop: es[:1]}},
		{Path: "hook", Profile: &profileResult{Skipped: "a path with its own runs"}},
		{Path: "connect", Profile: &profileResult{Seconds: 3, Errors: []string{"CPU profile: GET /debug/pprof/profile?seconds=3: 404"}}},
	}
	var b strings.Builder
	r.writeProfiles(&b)
	out := b.String()
	for _, want := range []string{
		"profiles (-profile /tmp/prof",
		"plain    3 s: plain.cpu.pprof, plain.allocs.pprof; 1230ms of CPU samples",
		"CPU top by flat%: 39.8% internal/runtime/syscall/linux.Syscall6, 0.0% internal/poll.ignoringEINTRIO (inline), 0.8% type:.eq.[2]interface {}",
		"CPU top by cum% (no runtime.*, no goroutine roots): 51.2% github.com/egressd/egressd/internal/proxy.(*conn).serve",
		"allocated (117.89MB in the window) top by flat%: 0.0% github.com",
		"hook     not profiled: a path with its own runs",
		"failed: CPU profile: GET /debug/pprof/profile?seconds=3: 404",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("profiles lack %q:\n%s", want, out)
		}
	}
	r.Settings.ProfileDir = ""
	b.Reset()
	r.writeProfiles(&b)
	if b.Len() != 0 {
		t.Errorf("profiles printed without -profile:\n%s", b.String())
	}
}
