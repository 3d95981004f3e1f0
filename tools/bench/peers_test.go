package main

import (
	"slices"
	"strings"
	"testing"
)

func TestParsePeers(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{peersDefault, []string{"goproxy", "smokescreen"}},
		{" smokescreen , goproxy ", []string{"smokescreen", "goproxy"}},
		{"off", nil},
		{" off ", nil},
	} {
		got, err := parsePeers(tc.in)
		if err != nil || !slices.Equal(names(got, peerKind.key), tc.want) {
			t.Errorf("parsePeers(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if got, _ := parsePeers("goproxy,smokescreen"); got[0].noMITM != "" || got[1].noMITM == "" {
		t.Error("goproxy must intercept and smokescreen not")
	}
	for _, bad := range []string{"", ",", "squid", "goproxy,goproxy", "goproxy=/opt/goproxybare", "off,goproxy"} {
		if got, err := parsePeers(bad); err == nil {
			t.Errorf("parsePeers(%q) = %v, want an error", bad, got)
		}
	}
}

// peerReport is a report with peers on plain and intercept, as run makes it.
func peerReport(rounds int) *report {
	r := &report{Settings: settings{Clients: 64, SizeBytes: 1024, DurationS: 1, Rounds: rounds, CPUs: 2},
		Peers: []peerInfo{{Peer: "goproxy", Binary: "/c/goproxybare", PeakRSSBytes: 15 << 20}, {Peer: "smokescreen", Binary: "/c/smokescreen", PeakRSSBytes: 20 << 20, Exit: "after SIGTERM: exit status 1"}}}
	for _, name := range []string{"plain", "intercept", "credential"} {
		d := runResult{ReqPerSec: 1000}
		x := runResult{ReqPerSec: 500, Requests: 10, CPUSeconds: 1e-3, P50US: 4000, P99US: 9000}
		p := pathResult{Path: name, Direct: d, Egressd: x}
		for range rounds {
			p.Rounds = append(p.Rounds, newRound(d, x))
		}
		p.finish()
		use := map[string]peerUse{"plain": peersTunnel, "intercept": peersIntercept}[name]
		for i, k := range peerKinds {
			if use == peersNone {
				break
			}
			if use == peersIntercept && k.noMITM != "" {
				p.Peers = append(p.Peers, pathResult{Path: k.name, Skipped: k.noMITM, NotApplicable: true})
				continue
			}
			rb := newRow(k.name, "", "")
			for j := range rounds {
				run := runResult{ReqPerSec: float64(300 + 100*i + 10*j), Requests: 10, CPUSeconds: 2e-3, P50US: 5000, P99US: 12000, Total: 20, UpstreamRequests: 20}
				run.hist.Record(5e6)
				rb.add(d, viaRun{r: run})
			}
			rb.res.PeakRSSBytes = int64(14+i) << 20
			p.Peers = append(p.Peers, rb.finish())
		}
		r.Paths = append(r.Paths, p)
	}
	return r
}

// tableRows is the main table's rows, by their first cell (indented ones
// keyed with their indentation and path, e.g. "plain/goproxy").
func tableRows(out string) map[string][]string {
	rows := map[string][]string{}
	path := ""
	for _, l := range strings.Split(out, "\n") {
		if l == "" && len(rows) > 0 {
			break
		}
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(l, "    ") {
			rows[path+"/"+f[0]] = f[1:]
			continue
		}
		path = f[0]
		rows[path] = f[1:]
	}
	return rows
}

func TestWriteTextPeers(t *testing.T) {
	r := peerReport(1)
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	rows := tableRows(out[strings.Index(out, "  path"):])
	for key, want := range map[string][]string{
		"path":                  {"direct", "req/s", "proxy", "req/s", "ratio", "direct", "p50/p99", "proxy", "p50/p99", "proxy", "CPU", "µs/req", "proxy", "VmHWM"},
		"plain":                 {"1,000", "500", "0.50", "0µs/0µs", "4.00ms/9.00ms", "100.0", "n/a"},
		"plain/goproxy":         {"300", "0.30", "5.00ms/5.00ms", "200.0", "14.0", "MiB"},
		"plain/smokescreen":     {"400", "0.40", "5.00ms/5.00ms", "200.0", "15.0", "MiB"},
		"intercept/goproxy":     {"300", "0.30", "5.00ms/5.00ms", "200.0", "14.0", "MiB"},
		"intercept/smokescreen": {"—", "—", "—", "—", "—"},
		"credential":            {"1,000", "500", "0.50", "0µs/0µs", "4.00ms/9.00ms", "100.0", "n/a"},
	} {
		if got := rows[key]; !slices.Equal(got, want) {
			t.Errorf("row %s = %q, want %q\n%s", key, got, want, out)
		}
	}
	if _, ok := rows["credential/goproxy"]; ok {
		t.Errorf("credential has a peer row:\n%s", out)
	}
	for _, want := range []string{
		"goproxy peak RSS (VmHWM over the whole run): 15.0 MiB",
		"smokescreen on intercept: —: run without MITM",
		"smokescreen did not exit cleanly: after SIGTERM: exit status 1",
		"  plain              goproxy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if r.failed() {
		t.Error("a peer's exit fails the report")
	}
}

// Skipped peers: a row that says so, and why under the table.
func TestWriteTextSkippedPeer(t *testing.T) {
	r := peerReport(1)
	r.Peers[0] = peerInfo{Peer: "goproxy", Skipped: "scripts/peers.sh build failed (exit status 1): peers: error: goproxy: go build failed"}
	for i := range r.Paths {
		for j := range r.Paths[i].Peers {
			if pr := &r.Paths[i].Peers[j]; pr.Path == "goproxy" {
				*pr = pathResult{Path: "goproxy", Skipped: r.Peers[0].Skipped}
			}
		}
	}
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	rows := tableRows(out[strings.Index(out, "  path"):])
	if got := rows["plain/goproxy"]; !slices.Equal(got, []string{"skipped", "-", "-", "-", "-"}) {
		t.Errorf("skipped goproxy row = %q\n%s", got, out)
	}
	if !strings.Contains(out, "goproxy: skipped: scripts/peers.sh build failed") {
		t.Errorf("report lacks why goproxy was skipped:\n%s", out)
	}
	if strings.Contains(out, "plain              goproxy") {
		t.Errorf("a skipped peer has a details row:\n%s", out)
	}
}

func TestWriteTextPeersRounds(t *testing.T) {
	r := peerReport(3)
	var b strings.Builder
	if err := r.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	rows := tableRows(out[strings.Index(out, "  path"):])
	if got, want := rows["plain/smokescreen"], []string{"410", "0.41", "0.40-0.42", "5.00ms/5.00ms", "200.0", "15.0", "MiB"}; !slices.Equal(got, want) {
		t.Errorf("row plain/smokescreen = %q, want %q\n%s", got, want, out)
	}
	if got, want := rows["intercept/smokescreen"], []string{"—", "—", "—", "—", "—", "—"}; !slices.Equal(got, want) {
		t.Errorf("row intercept/smokescreen = %q, want %q\n%s", got, want, out)
	}
	if !strings.Contains(out, "    goproxy     0.30 0.31 0.32\n") {
		t.Errorf("no per-round ratios of goproxy:\n%s", out)
	}
}

// A peer that was not built, or that does not intercept on an intercepted
// path, has a row saying why, and it never runs.
func TestPeerLegsSkipped(t *testing.T) {
	ps := peerSet{{peerInfo: peerInfo{Peer: "goproxy", Skipped: "build failed"}, kind: peerKinds[0]},
		{peerInfo: peerInfo{Peer: "smokescreen", Binary: "/c/smokescreen"}, kind: peerKinds[1]}}
	p, _ := lookupPaths("intercept")
	peerRows := ps.rows(t.Context(), p[0], &world{}, loadOptions{})
	direct := func(int) (runResult, error) { return runResult{}, nil }
	if err := runRounds(pathEnv{o: options{rounds: 2}}, direct, nil, peerRows); err != nil {
		t.Fatal(err)
	}
	rows := finishAll(peerRows)
	if len(rows) != 2 || rows[0].Skipped != "build failed" || rows[0].NotApplicable || !rows[1].NotApplicable || rows[1].Skipped == "" || len(rows[1].Rounds) != 0 {
		t.Errorf("peer rows = %+v", rows)
	}
}
