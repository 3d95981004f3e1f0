package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestCombineRounds(t *testing.T) {
	var a, b runResult
	a.hist.Record(time.Millisecond)
	b.hist.Record(3 * time.Millisecond)
	a.ReqPerSec, b.ReqPerSec = 100, 300
	a.Requests, b.Requests = 1, 1
	a.Errors, b.ErrorKinds, b.Errors = 0, map[string]int64{"boom": 2}, 2
	r := newRow("plain", "", "")
	r.add(runResult{ReqPerSec: 1}, viaRun{r: a})
	r.add(runResult{ReqPerSec: 1}, viaRun{r: b})
	if c := r.finish().Egressd; c.ReqPerSec != 200 || c.Requests != 2 || c.Errors != 2 || c.ErrorKinds["boom"] != 2 || c.hist.N() != 2 || c.MaxUS < 2900 {
		t.Errorf("combined = %+v", c)
	}

	p := pathResult{Path: "plain", Rounds: []roundResult{
		newRound(runResult{ReqPerSec: 100}, runResult{ReqPerSec: 50, Requests: 10, CPUSeconds: 1e-3}),
		newRound(runResult{ReqPerSec: 100}, runResult{ReqPerSec: 70, Requests: 10, CPUSeconds: 2e-3}),
		newRound(runResult{ReqPerSec: 100}, runResult{ReqPerSec: 60, Requests: 10, CPUSeconds: 3e-3}),
	}}
	p.finish()
	if lo, hi := ratioRange(p.Rounds); p.Ratio != 0.6 || lo != 0.5 || hi != 0.7 || p.CPUPerReqUS != 200 {
		t.Errorf("ratio %v (%v-%v), cpu %v", p.Ratio, lo, hi, p.CPUPerReqUS)
	}
}

func TestWriteTextIntercept(t *testing.T) {
	r := &report{Settings: settings{Clients: 64, SizeBytes: 1024, DurationS: 1, Rounds: 2, CPUs: 2},
		LeafCache: &leafCounts{Hit: 100, Miss: 2}}
	for _, name := range []string{"intercept", "intercept-newconn", "credential"} {
		p := pathResult{Path: name, NewConnPerRequest: name == "intercept-newconn", LeafCache: &leafCounts{Hit: 50, Miss: 1},
			Direct: runResult{ReqPerSec: 1000}, Egressd: runResult{ReqPerSec: 500, Requests: 10, CPUSeconds: 1e-3},
			Rounds: []roundResult{
				newRound(runResult{ReqPerSec: 1000}, runResult{ReqPerSec: 500, Requests: 10, CPUSeconds: 1e-3}),
				newRound(runResult{ReqPerSec: 1000}, runResult{ReqPerSec: 400, Requests: 10, CPUSeconds: 1e-3}),
			}}
		p.finish()
		r.Paths = append(r.Paths, p)
	}
	r.Paths[2].Problems = []string{"egressd run: 0 of 10 upstream requests carried it"}
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"ratio min-max", "0.40-0.50", "1,000 client TLS handshakes/s direct, 450 through egressd",
		"credential / intercept: ratio 0.45 / 0.45 = 1.00", "100 hits, 2 misses", "ratio per round:", "injection check failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if !r.failed() {
		t.Error("a failed injection check does not fail the report")
	}
}

func TestWriteTextVault(t *testing.T) {
	r := &report{Settings: settings{Clients: 64, SizeBytes: 1024, DurationS: 1, Rounds: 1, CPUs: 2}}
	for _, name := range []string{"credential", "vault"} {
		via := runResult{ReqPerSec: 450, Requests: 10, CPUSeconds: 1e-3, P50US: 4000, P99US: 9000}
		if name == "vault" {
			via.CPUSeconds = 1.1e-3
		}
		p := pathResult{Path: name, Direct: runResult{ReqPerSec: 1000}, Egressd: via,
			Rounds: []roundResult{newRound(runResult{ReqPerSec: 1000}, via)}}
		p.finish()
		r.Paths = append(r.Paths, p)
	}
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	if want := "vault / credential: ratio 0.45 / 0.45 = 1.00, egressd req/s 1.00, egressd CPU 110.0 vs 100.0 µs/req (+10%)"; !strings.Contains(b.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, b.String())
	}

	r.Paths[1] = pathResult{Path: "vault", Skipped: "no scripts/vaultdev.sh in the working directory"}
	b.Reset()
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"vault: skipped: no scripts/vaultdev.sh in the working directory"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "vault / credential") {
		t.Errorf("a skipped vault path is compared:\n%s", out)
	}
	row := false
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "vault" && f[1] == "skipped" {
			row = true
		}
	}
	if !row {
		t.Errorf("no table row \"vault skipped\":\n%s", out)
	}
	if r.failed() {
		t.Error("a skipped path fails the report")
	}
}

func TestCompareNote(t *testing.T) {
	rep := &report{Paths: []pathResult{
		{Path: "hook", Ratio: 0.30, CPUPerReqUS: 90, Egressd: runResult{ReqPerSec: 9000, P50US: 5000, P99US: 12000}},
		{Path: hookOtherRow, Ratio: 0.40, CPUPerReqUS: 60, Egressd: runResult{ReqPerSec: 12000, P50US: 3500, P99US: 11000}},
		{Path: "transparent", Skipped: "needs root"},
		{Path: transparentExplicitRow, Ratio: 0.50, Egressd: runResult{ReqPerSec: 26000}},
	}}
	var b bytes.Buffer
	rep.compareNote(&b, "hook", hookOtherRow, " (why)")
	want := "hook / intercept-post: ratio 0.30 / 0.40 = 0.75, egressd req/s 0.75, egressd CPU 90.0 vs 60.0 µs/req (+50%), p50 5.00ms vs 3.50ms, p99 12.0ms vs 11.0ms (why)\n"
	if b.String() != want {
		t.Errorf("note = %q, want %q", b.String(), want)
	}
	for _, pair := range [][2]string{{"transparent", transparentExplicitRow}, {"hook", "absent"}, {"absent", "hook"}} {
		b.Reset()
		if rep.compareNote(&b, pair[0], pair[1], ""); b.Len() > 0 {
			t.Errorf("%s / %s: a skipped or absent row has a note: %s", pair[0], pair[1], b.String())
		}
	}
}
