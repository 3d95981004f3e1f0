package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/procfs"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// Peers: other egress proxies, measured beside egressd in the same run. On
// every path that one of them can carry, each round runs direct, through
// egressd, then through each peer, with the same load settings; a peer's ratio
// is its req/s over the same round's direct req/s. Each peer is one process,
// started once before the first path and stopped with SIGTERM after the last,
// like egressd. Their binaries come from scripts/peers.sh (or -peers
// name=PATH); a peer that cannot be built or started is reported as skipped,
// and the bench goes on without it.
//
//   - goproxy: tools/peers (goproxybare), a bare github.com/elazarl/goproxy
//     forward proxy. It tunnels every CONNECT but those to transformHost, which
//     it intercepts with a CA the bench makes for it (its clients trust that CA).
//     It resolves names like egressd: /etc/hosts, then a DNS stub of its own
//     (-resolver), so its intercepted runs use the very URL egressd's do.
//   - smokescreen: github.com/stripe/smokescreen, no ACL file, allowed
//     127.0.0.0/8 (it denies loopback by default). It is run without MITM, so
//     the intercepted paths are "—" for it.

const (
	// peersOff is the -peers value that measures no peer.
	peersOff = "off"
	// peersDefault is -peers' default: every peer.
	peersDefault = "goproxy,smokescreen"
	// peersScript builds the peers and prints name=PATH lines; the bench runs
	// it when -peers names no path and it is in the working directory.
	peersScript = "scripts/peers.sh"
	// peerBuildTimeout bounds `scripts/peers.sh build`: milliseconds when
	// cached, well under a minute each cold.
	peerBuildTimeout = 10 * time.Minute
	// peerMaxIdlePerHost is each peer's pool of idle upstream connections per
	// host. net/http's default of 2 would make 64 keep-alive clients reconnect
	// to the upstream on almost every request (and run out of ports on a long
	// run); egressd keeps its connections.
	peerMaxIdlePerHost = 1024
	// peerStartAttempts is how often smokescreen is started on a new free
	// port when the one picked was taken before it could bind it.
	peerStartAttempts = 3
)

// peerKind is one peer the bench knows.
type peerKind struct {
	name string
	// mitm: it can intercept, so it also runs on the intercepted paths
	// (pathSpec.peers == peersIntercept).
	mitm bool
	// noMITM is why it has no row on an intercepted path.
	noMITM string
}

var peerKinds = []peerKind{
	{name: "goproxy", mitm: true},
	{name: "smokescreen", noMITM: "run without MITM (its MITM needs an ACL file and a CA); intercepted paths are not measured for it"},
}

func peerKindNames() []string {
	names := make([]string, len(peerKinds))
	for i, k := range peerKinds {
		names[i] = k.name
	}
	return names
}

// peerUse is which peers a path runs through.
type peerUse int

const (
	peersNone      peerUse = iota // egressd only (credential, vault, hook, transparent)
	peersTunnel                   // every peer: absolute-form HTTP or a CONNECT tunnel
	peersIntercept                // an intercepted path: only peers with MITM
)

// withPeers sets which peers p runs through.
func withPeers(p pathSpec, u peerUse) pathSpec {
	p.peers = u
	return p
}

// peerSpec is one entry of -peers: a peer, and its binary if given.
type peerSpec struct {
	kind peerKind
	bin  string // "" finds it with peersScript
}

// parsePeers parses -peers: "off", or comma-separated peer names, each once,
// each optionally name=PATH to a binary.
func parsePeers(list string) ([]peerSpec, error) {
	list = strings.TrimSpace(list)
	if list == peersOff {
		return nil, nil
	}
	var out []peerSpec
	for entry := range strings.SplitSeq(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, bin, hasBin := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(peerKinds, func(k peerKind) bool { return k.name == name })
		if i < 0 {
			return nil, fmt.Errorf("-peers: unknown peer %q (known: %s; or %s)", name, strings.Join(peerKindNames(), ", "), peersOff)
		}
		if slices.ContainsFunc(out, func(s peerSpec) bool { return s.kind.name == name }) {
			return nil, fmt.Errorf("-peers: %q given twice", name)
		}
		if bin = strings.TrimSpace(bin); hasBin && bin == "" {
			return nil, fmt.Errorf("-peers: %s= names no binary", name)
		}
		out = append(out, peerSpec{kind: peerKinds[i], bin: bin})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-peers: name at least one of %s, or %s", strings.Join(peerKindNames(), ", "), peersOff)
	}
	return out, nil
}

// needsPeers reports whether any of ps runs through a peer.
func needsPeers(ps []pathSpec) bool {
	return slices.ContainsFunc(ps, func(p pathSpec) bool { return p.peers != peersNone })
}

// findPeers returns each peer's binary, or why it is skipped. A binary given
// as name=PATH must be an executable (an error otherwise); the others come
// from peersScript build in the working directory, when there is one.
func findPeers(ctx context.Context, specs []peerSpec, stderr io.Writer) (bins, skips map[string]string, err error) {
	bins, skips = map[string]string{}, map[string]string{}
	var build []string
	for _, s := range specs {
		if s.bin == "" {
			build = append(build, s.kind.name)
			continue
		}
		abs, err := executable(s.bin)
		if err != nil {
			return nil, nil, fmt.Errorf("-peers %s=%s: %v; build one with %s build, or -peers %s", s.kind.name, s.bin, err, peersScript, peersOff)
		}
		bins[s.kind.name] = abs
	}
	if len(build) == 0 {
		return bins, skips, nil
	}
	if _, err := os.Stat(peersScript); err != nil {
		for _, n := range build {
			skips[n] = "no " + peersScript + " in the working directory (run from the repository root, or pass -peers " + n + "=PATH)"
		}
		return bins, skips, nil
	}
	fmt.Fprintf(stderr, "bench: peers: %s build %s (cached: instant; cold: under a minute each; -peers %s skips them)\n", peersScript, strings.Join(build, " "), peersOff)
	out, errOut, runErr := runBuild(ctx, peerBuildTimeout, peersScript, build...) // a failed peer prints no line; the others still do
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("peers: %w", err)
	}
	got := parsePeerPaths(out)
	for _, n := range build {
		if p, ok := got[n]; ok {
			bins[n] = p
			continue
		}
		why := lastLine(peerErrorLine(errOut, n))
		if why == "" {
			why = "printed no " + n + "= line"
		}
		skips[n] = fmt.Sprintf("%s build failed (%v): %s", peersScript, runErr, why)
	}
	return bins, skips, nil
}

// parsePeerPaths reads peersScript's name=PATH lines.
func parsePeerPaths(out []byte) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(string(out)) {
		name, path, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && name != "" && path != "" {
			m[name] = path
		}
	}
	return m
}

// peerErrorLine is the last line of the script's stderr that names peer, else
// its last line.
func peerErrorLine(stderr, peer string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "error: "+peer) {
			return lines[i]
		}
	}
	return lines[len(lines)-1]
}

// peerProc is one running peer.
type peerProc struct {
	kind peerKind
	bin  string
	*child
	proxyURL string         // http://127.0.0.1:port
	roots    *x509.CertPool // what clients of its intercepted tunnels trust
	logPath  string         // its stderr
	outPath  string         // its stdout
}

// peerSet is every peer of a run: those started, and why the others are not.
type peerSet struct {
	procs []*peerProc
	// order is every peer -peers named, in its order; skipped says why one
	// has no process.
	order   []peerKind
	skipped map[string]string
	bins    map[string]string
	// dns is the peers' own DNS stub (the same answers as egressd's), so that
	// egressd's DNS query counts stay its own.
	dns *dnsstub.Server
}

// startPeers finds and starts the peers in o.peers when a path needs them.
// Only a bad -peers PATH or an interrupt is an error: a peer that cannot be
// built or started is skipped.
func startPeers(ctx context.Context, o options, dir string, up *upstream, stderr io.Writer) (*peerSet, error) {
	if len(o.peers) == 0 || !needsPeers(o.paths) {
		return nil, nil
	}
	ps := &peerSet{skipped: map[string]string{}}
	for _, s := range o.peers {
		ps.order = append(ps.order, s.kind)
	}
	bins, skips, err := findPeers(ctx, o.peers, stderr)
	if err != nil {
		return nil, err
	}
	ps.bins = bins
	for n, why := range skips {
		ps.skipped[n] = why
	}
	pdir := filepath.Join(dir, "peers")
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return nil, err
	}
	for _, k := range ps.order {
		bin, ok := bins[k.name]
		if !ok {
			continue
		}
		var pp *peerProc
		switch k.name {
		case "goproxy":
			if ps.dns == nil {
				if ps.dns, err = startDNS(); err != nil {
					ps.skipped[k.name] = "its DNS stub: " + err.Error()
					continue
				}
			}
			pp, err = startGoproxy(ctx, k, bin, pdir, up, ps.dns.Addr)
		case "smokescreen":
			pp, err = startSmokescreen(ctx, k, bin, pdir)
		}
		if err != nil {
			if ctx.Err() != nil {
				ps.stop()
				return nil, fmt.Errorf("peers: %w", ctx.Err())
			}
			ps.skipped[k.name] = "did not start: " + err.Error()
			continue
		}
		ps.procs = append(ps.procs, pp)
	}
	return ps, nil
}

// stop stops every peer (SIGTERM, then SIGKILL after stopTimeout) and their
// DNS stub; it returns how each that did not exit 0 ended.
func (ps *peerSet) stop() map[string]string {
	if ps == nil {
		return nil
	}
	var out map[string]string
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range ps.procs {
		wg.Go(func() {
			if msg := p.stop(); msg != "" {
				mu.Lock()
				if out == nil {
					out = map[string]string{}
				}
				out[p.kind.name] = msg
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ps.dns != nil {
		ps.dns.Close()
		ps.dns = nil
	}
	return out
}

func (ps *peerSet) proc(name string) *peerProc {
	for _, p := range ps.procs {
		if p.kind.name == name {
			return p
		}
	}
	return nil
}

// spawn starts bin with args in dir, its stdout and stderr in files there, in
// its own process group (Ctrl-C reaches the bench, which stops it), with
// SIGTERM if the bench dies, and without the environment's proxy settings.
func spawnPeer(k peerKind, bin, dir string, args []string) (*peerProc, error) {
	p := &peerProc{
		kind:    k,
		bin:     bin,
		logPath: filepath.Join(dir, k.name+".log"),
		outPath: filepath.Join(dir, k.name+".stdout"),
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = withoutProxyEnv(os.Environ())
	c, err := startChild(cmd, p.outPath, p.logPath)
	if err != nil {
		return nil, err
	}
	p.child = c
	return p, nil
}

// withoutProxyEnv drops HTTP_PROXY and its kin: a peer must dial the upstream
// itself, whatever the environment says.
func withoutProxyEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToLower(k) {
		case "http_proxy", "https_proxy", "all_proxy", "no_proxy":
			return true
		}
		return false
	})
}

// startGoproxy runs goproxybare on 127.0.0.1:0 with a CA made for it now, and
// waits for its "listening ADDR" line.
func startGoproxy(ctx context.Context, k peerKind, bin, dir string, up *upstream, dnsAddr string) (*peerProc, error) {
	caCert, caKey, roots, err := writePeerCA(dir)
	if err != nil {
		return nil, err
	}
	upCA := filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(upCA, up.caPEM, 0o600); err != nil {
		return nil, err
	}
	p, err := spawnPeer(k, bin, dir, []string{
		"-listen", "127.0.0.1:0",
		"-ca-cert", caCert, "-ca-key", caKey,
		"-mitm-hosts", transformHost,
		"-upstream-ca", upCA,
		"-resolver", dnsAddr,
		"-max-idle-per-host", strconv.Itoa(peerMaxIdlePerHost),
	})
	if err != nil {
		return nil, err
	}
	p.roots = roots
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		if addr := listeningLine(p.outPath); addr != "" {
			if err := loopbackOnly(addr); err != nil {
				p.stop()
				return nil, err
			}
			p.proxyURL = "http://" + addr
			return p, nil
		}
		if err := p.pause(ctx, "its listening line"); err != nil {
			p.stop()
			return nil, fmt.Errorf("%w%s", err, p.logTail())
		}
	}
}

// listeningLine is the address in goproxybare's "listening ADDR" line, or "".
func listeningLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			return strings.TrimSpace(addr)
		}
	}
	return ""
}

// startSmokescreen runs smokescreen on a free port of 127.0.0.1 (it cannot
// bind port 0 and say which it got), allowing 127.0.0.0/8, and waits until
// the port accepts.
func startSmokescreen(ctx context.Context, k peerKind, bin, dir string) (*peerProc, error) {
	// Not an ACL: only the upstream pool size, which has no flag.
	cfg := filepath.Join(dir, "smokescreen.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "# Generated by egressd's bench for one run.\ntransport_max_idle_conns_per_host: %d\n", peerMaxIdlePerHost), 0o600); err != nil {
		return nil, err
	}
	var lastErr error
	for range peerStartAttempts {
		addr, err := freeLoopbackPort()
		if err != nil {
			return nil, err
		}
		p, err := spawnPeer(k, bin, dir, []string{
			"--config-file", cfg,
			"--listen-ip", "127.0.0.1",
			"--listen-port", strconv.Itoa(portNum(addr)),
			"--allow-range", "127.0.0.0/8",
		})
		if err != nil {
			return nil, err
		}
		if lastErr = p.waitAccepting(ctx, addr); lastErr == nil {
			p.proxyURL = "http://" + addr
			return p, nil
		}
		p.stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, lastErr
}

// freeLoopbackPort is 127.0.0.1:port with a port nothing listened on a moment ago.
func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// waitAccepting waits until addr accepts a connection from the peer's
// process, failing if it exits first.
func (p *peerProc) waitAccepting(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if err := p.pause(ctx, "its port "+addr); err != nil {
			return fmt.Errorf("%w%s", err, p.logTail())
		}
	}
}

func (p *peerProc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 1000 {
		b = b[len(b)-1000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; it said:\n" + string(b)
}

func (p *peerProc) peakRSS() int64 {
	n, _ := procfs.PeakRSS(p.cmd.Process.Pid)
	return n
}

// writePeerCA makes a throwaway CA (ECDSA P-256, like egressd's) for
// goproxybare's interception, writes its certificate and key into dir, and
// returns their paths and a pool with it for the clients.
func writePeerCA(dir string) (certPath, keyPath string, roots *x509.CertPool, err error) {
	ca, err := testpki.NewCA("egressd bench peer CA (goproxy)")
	if err != nil {
		return "", "", nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return "", "", nil, err
	}
	certPath, keyPath = filepath.Join(dir, "goproxy-ca.pem"), filepath.Join(dir, "goproxy-ca-key.pem")
	if err := os.WriteFile(certPath, ca.PEM(), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	return certPath, keyPath, ca.Pool, nil
}

// peerResult is one peer on one path: its runs, one per round, each right
// after that round's egressd run.
type peerResult struct {
	Peer string `json:"peer"`
	// Skipped says why the peer has no figures here: it was not built or did
	// not start, or (NotApplicable) it does not intercept.
	Skipped       string `json:"skipped,omitempty"`
	NotApplicable bool   `json:"not_applicable,omitempty"`
	// Run is every round's run together, as pathResult.Egressd.
	Run runResult `json:"run"`
	// Ratio is the median over the rounds of the peer's req/s over the same
	// round's direct req/s; CPUPerReqUS the median of its CPU per request.
	Ratio       float64     `json:"ratio"`
	CPUPerReqUS float64     `json:"cpu_us_per_req"`
	Rounds      []peerRound `json:"rounds,omitempty"`
	// PeakRSSBytes is the peer's VmHWM after the path (the peak so far).
	PeakRSSBytes int64 `json:"peak_rss_after_bytes"`
}

type peerRound struct {
	DirectReqPerSec float64 `json:"direct_req_per_s"`
	ReqPerSec       float64 `json:"req_per_s"`
	Ratio           float64 `json:"ratio"`
	CPUPerReqUS     float64 `json:"cpu_us_per_req"`
	cpuOK           bool
}

func (r *peerResult) skipped() bool { return r.Skipped != "" }

// ratioRange is the lowest and highest ratio over the rounds.
func (r *peerResult) ratioRange() (lo, hi float64) {
	return minMax(r.Rounds, func(rd peerRound) float64 { return rd.Ratio })
}

// pathPeers collects one path's peer runs over its rounds.
type pathPeers struct {
	ps      *peerSet
	p       pathSpec
	results []peerResult
	runs    [][]runResult // per result, per round
}

// forPath is what measurePath needs for p's peers; nil (a no-op) when p runs
// through none or no peer was asked for.
func (ps *peerSet) forPath(p pathSpec) *pathPeers {
	if ps == nil || p.peers == peersNone {
		return nil
	}
	pp := &pathPeers{ps: ps, p: p}
	for _, k := range ps.order {
		r := peerResult{Peer: k.name}
		switch {
		case p.peers == peersIntercept && !k.mitm:
			r.Skipped, r.NotApplicable = k.noMITM, true
		case ps.skipped[k.name] != "":
			r.Skipped = ps.skipped[k.name]
		}
		pp.results = append(pp.results, r)
	}
	pp.runs = make([][]runResult, len(pp.results))
	return pp
}

// round runs the path through every peer that carries it, with the load
// egressd's run of the round had; direct is that round's direct run.
func (pp *pathPeers) round(ctx context.Context, w *world, lo loadOptions, direct runResult) error {
	if pp == nil {
		return nil
	}
	for i := range pp.results {
		r := &pp.results[i]
		if r.skipped() {
			continue
		}
		proc := pp.ps.proc(r.Peer)
		t := pp.p.viaProxy(w)
		t.proxy = proc.proxyURL
		if pp.p.peers == peersIntercept {
			t.roots = proc.roots
		}
		x, err := runLoad(ctx, t, lo, w.up, proc.cpuTime)
		if err != nil {
			return fmt.Errorf("through %s: %w", r.Peer, err)
		}
		rd := peerRound{DirectReqPerSec: direct.ReqPerSec, ReqPerSec: x.ReqPerSec}
		if direct.ReqPerSec > 0 {
			rd.Ratio = x.ReqPerSec / direct.ReqPerSec
		}
		if x.Requests > 0 && x.CPUError == "" {
			rd.CPUPerReqUS, rd.cpuOK = x.CPUSeconds*1e6/float64(x.Requests), true
		}
		r.Rounds = append(r.Rounds, rd)
		pp.runs[i] = append(pp.runs[i], x)
	}
	return nil
}

// finish folds the rounds and reads each peer's peak RSS.
func (pp *pathPeers) finish() []peerResult {
	if pp == nil {
		return nil
	}
	for i := range pp.results {
		r := &pp.results[i]
		if r.skipped() || len(pp.runs[i]) == 0 {
			continue
		}
		r.fold(pp.runs[i])
		r.PeakRSSBytes = pp.ps.proc(r.Peer).peakRSS()
	}
	return pp.results
}

// fold sets the peer's figures from its rounds' runs: as pathResult.finish,
// the medians over the rounds.
func (r *peerResult) fold(runs []runResult) {
	r.Run = combine(runs)
	r.Ratio, r.CPUPerReqUS = roundMedians(r.Rounds, func(rd peerRound) (float64, float64, bool) {
		return rd.Ratio, rd.CPUPerReqUS, rd.cpuOK
	})
}

// peerInfo is one peer of the run, for the report: its binary, or why it was
// skipped, its peak RSS and how it exited.
type peerInfo struct {
	Peer         string `json:"peer"`
	Binary       string `json:"binary,omitempty"`
	Skipped      string `json:"skipped,omitempty"`
	PeakRSSBytes int64  `json:"peak_rss_bytes,omitempty"`
	Exit         string `json:"exit,omitempty"`
}

// infos stops the peers and describes them. Call it once, after the last path.
func (ps *peerSet) infos() []peerInfo {
	if ps == nil {
		return nil
	}
	var out []peerInfo
	rss := map[string]int64{}
	for _, p := range ps.procs {
		rss[p.kind.name] = p.peakRSS() // before it exits
	}
	exits := ps.stop()
	for _, k := range ps.order {
		out = append(out, peerInfo{Peer: k.name, Binary: ps.bins[k.name], Skipped: ps.skipped[k.name],
			PeakRSSBytes: rss[k.name], Exit: exits[k.name]})
	}
	return out
}

// namedRun is one side of a path in the details and problems lists.
type namedRun struct {
	name string
	r    runResult
}

// namedRuns is the path's direct and egressd runs, then each measured peer's.
func (p *pathResult) namedRuns() []namedRun {
	runs := []namedRun{{"direct", p.Direct}, {"egressd", p.Egressd}}
	for _, pr := range p.Peers {
		if !pr.skipped() {
			runs = append(runs, namedRun{pr.Peer, pr.Run})
		}
	}
	return runs
}

// hasPeerRows reports whether the main table has a peer row.
func (r *report) hasPeerRows() bool {
	return slices.ContainsFunc(r.Paths, func(p pathResult) bool { return len(p.Peers) > 0 })
}

// peerLabel is a peer row's first cell, indented under its path's row.
func peerLabel(pr peerResult) string { return "  " + pr.Peer }

// writePeerRows writes a path's peer rows under its egressd row, in the same
// columns; the direct ones are the path row's. A peer that does not intercept
// shows "—" on an intercepted path, one that was not built or did not start
// "skipped" (the reasons are under the table).
func writePeerRows(tw io.Writer, p pathResult, pw int, multi bool) {
	for _, pr := range p.Peers {
		fmt.Fprintf(tw, "%-*s\t\t", pw, peerLabel(pr))
		switch {
		case pr.NotApplicable:
			fmt.Fprint(tw, "—\t—\t")
			if multi {
				fmt.Fprint(tw, "—\t")
			}
			fmt.Fprint(tw, "\t—\t—\t—\t\n")
		case pr.skipped():
			fmt.Fprint(tw, "skipped\t-\t")
			if multi {
				fmt.Fprint(tw, "-\t")
			}
			fmt.Fprint(tw, "\t-\t-\t-\t\n")
		default:
			cpu := fmt.Sprintf("%.1f", pr.CPUPerReqUS)
			if pr.Run.CPUError != "" {
				cpu = "n/a"
			}
			fmt.Fprintf(tw, "%s\t%.2f\t", thousands(pr.Run.ReqPerSec), pr.Ratio)
			if multi {
				lo, hi := pr.ratioRange()
				fmt.Fprintf(tw, "%.2f-%.2f\t", lo, hi)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t\n", latencies(pr.Run), cpu, mib(pr.PeakRSSBytes))
		}
	}
}

// writePeers says, under the table, what the peer rows are: each peer's peak
// RSS, why one was skipped or has "—", and how one did not exit cleanly.
func (r *report) writePeers(w io.Writer) {
	if len(r.Peers) == 0 {
		return
	}
	fmt.Fprintln(w, "peers (indented rows): the same load through each, every round right after egressd's run; ratio against that round's direct run")
	for _, pi := range r.Peers {
		switch {
		case pi.Skipped != "":
			fmt.Fprintf(w, "  %s: skipped: %s\n", pi.Peer, pi.Skipped)
		default:
			fmt.Fprintf(w, "  %s peak RSS (VmHWM over the whole run): %s\n", pi.Peer, mib(pi.PeakRSSBytes))
		}
		var na []string
		why := ""
		for _, p := range r.Paths {
			for _, pr := range p.Peers {
				if pr.Peer == pi.Peer && pr.NotApplicable {
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

// writePeerRounds lists every round's ratio of each measured peer of p, under
// p's line of "ratio per round".
func writePeerRounds(w io.Writer, p pathResult, pw int) {
	for _, pr := range p.Peers {
		if pr.skipped() {
			continue
		}
		fmt.Fprintf(w, "  %-*s", pw, peerLabel(pr))
		for _, rd := range pr.Rounds {
			fmt.Fprintf(w, " %.2f", rd.Ratio)
		}
		fmt.Fprintln(w)
	}
}
