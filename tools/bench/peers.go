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
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/procfs"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// Peers: other egress proxies, measured beside egressd in the same run. On a
// path a peer can carry, each round runs direct, through egressd, then through
// each peer with the same load; a peer's ratio is against the same round's
// direct run. A peer that cannot be built or started is reported as skipped.
//
//   - goproxy: tools/peers (goproxybare), a bare github.com/elazarl/goproxy. It
//     intercepts transformHost with a CA made for it, tunnels every other
//     CONNECT, and resolves like egressd (/etc/hosts, then its own DNS stub), so
//     its intercepted runs use the very URL egressd's do.
//   - smokescreen: no ACL file, 127.0.0.0/8 allowed (it denies loopback by
//     default), no MITM: the intercepted paths are "—" for it.

const (
	peersDefault = "goproxy,smokescreen"
	// peersScript builds the peers and prints name=PATH lines.
	peersScript = "scripts/peers.sh"
	// peerMaxIdlePerHost: net/http's default of 2 would make 64 keep-alive
	// clients reconnect to the upstream on almost every request.
	peerMaxIdlePerHost = 1024
	// peerStartAttempts: smokescreen cannot bind port 0, so the bench picks a
	// free port, which something else may take first.
	peerStartAttempts = 3
)

// peerKind is one peer the bench knows; noMITM says why one has no row on an
// intercepted path.
type peerKind struct{ name, noMITM string }

var peerKinds = []peerKind{
	{name: "goproxy"},
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
	peersNone      peerUse = iota
	peersTunnel            // every peer: absolute-form HTTP or a CONNECT tunnel
	peersIntercept         // only the peers with MITM
)

// peerSpec is one entry of -peers: a peer, and its binary if given.
type peerSpec struct {
	kind peerKind
	bin  string // "" builds it with peersScript
}

// parsePeers parses -peers: "off", or peer names, each once, each NAME or NAME=PATH.
func parsePeers(list string) ([]peerSpec, error) {
	if list = strings.TrimSpace(list); list == scriptOff {
		return nil, nil
	}
	var out []peerSpec
	for entry := range strings.SplitSeq(list, ",") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		name, bin, hasBin := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(peerKinds, func(k peerKind) bool { return k.name == name })
		switch {
		case i < 0:
			return nil, fmt.Errorf("-peers: unknown peer %q (known: %s; or %s)", name, strings.Join(peerKindNames(), ", "), scriptOff)
		case slices.ContainsFunc(out, func(s peerSpec) bool { return s.kind.name == name }):
			return nil, fmt.Errorf("-peers: %q given twice", name)
		}
		if bin = strings.TrimSpace(bin); hasBin && bin == "" {
			return nil, fmt.Errorf("-peers: %s= names no binary", name)
		}
		out = append(out, peerSpec{kind: peerKinds[i], bin: bin})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-peers: name at least one of %s, or %s", strings.Join(peerKindNames(), ", "), scriptOff)
	}
	return out, nil
}

// findPeers returns each peer's binary, or why it is skipped. A name=PATH
// binary must be an executable; the others come from peersScript build.
func findPeers(ctx context.Context, specs []peerSpec, stderr io.Writer) (bins, skips map[string]string, err error) {
	bins, skips = map[string]string{}, map[string]string{}
	var build []string
	for _, s := range specs {
		if s.bin == "" {
			build = append(build, s.kind.name)
		} else if bins[s.kind.name], err = executable(s.bin); err != nil {
			return nil, nil, fmt.Errorf("-peers %s=%s: %v; build one with %s build, or -peers %s", s.kind.name, s.bin, err, peersScript, scriptOff)
		}
	}
	if _, err := os.Stat(peersScript); err != nil || len(build) == 0 {
		for _, n := range build {
			skips[n] = "no " + peersScript + " in the working directory (run from the repository root, or pass -peers " + n + "=PATH)"
		}
		return bins, skips, nil
	}
	fmt.Fprintf(stderr, "bench: peers: %s build %s (cached: instant; cold: under a minute each; -peers %s skips them)\n", peersScript, strings.Join(build, " "), scriptOff)
	out, errOut, runErr := runBuild(ctx, vaultBuildTimeout, peersScript, build...) // a failed peer prints no line
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("peers: %w", err)
	}
	for line := range strings.Lines(string(out)) {
		if name, path, ok := strings.Cut(strings.TrimSpace(line), "="); ok && path != "" {
			bins[name] = path
		}
	}
	for _, n := range build {
		if bins[n] == "" {
			skips[n] = fmt.Sprintf("%s build failed (%v): %s", peersScript, runErr, lastLine(errOut))
		}
	}
	return bins, skips, nil
}

// peerProc is one running peer.
type peerProc struct {
	*child
	kind     peerKind
	proxyURL string         // http://127.0.0.1:port
	roots    *x509.CertPool // what clients of its intercepted tunnels trust
}

// peerSet is every peer of a run: those started, and why the others are not.
type peerSet struct {
	procs   map[string]*peerProc
	order   []peerKind // as -peers named them
	skipped map[string]string
	bins    map[string]string
	dns     *dnsstub.Server // goproxy's own, so egressd's DNS counts stay its own
}

// startPeers finds and starts the peers when a path needs them. Only a bad
// -peers PATH or an interrupt is an error.
func startPeers(ctx context.Context, o options, dir string, up *upstream, stderr io.Writer) (*peerSet, error) {
	if len(o.peers) == 0 || !slices.ContainsFunc(o.paths, func(p pathSpec) bool { return p.peers != peersNone }) {
		return nil, nil
	}
	ps := &peerSet{procs: map[string]*peerProc{}}
	for _, s := range o.peers {
		ps.order = append(ps.order, s.kind)
	}
	var err error
	if ps.bins, ps.skipped, err = findPeers(ctx, o.peers, stderr); err != nil {
		return nil, err
	}
	pdir := filepath.Join(dir, "peers")
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return nil, err
	}
	for _, k := range ps.order {
		if bin, ok := ps.bins[k.name]; ok {
			if err := ps.start(ctx, k, bin, pdir, up); err != nil {
				ps.stop()
				return nil, err
			}
		}
	}
	return ps, nil
}

// start starts one peer, or records why it did not start.
func (ps *peerSet) start(ctx context.Context, k peerKind, bin, dir string, up *upstream) error {
	var p *peerProc
	var err error
	if k.name == "goproxy" {
		if ps.dns == nil {
			ps.dns, err = startDNS()
		}
		if err == nil {
			p, err = startGoproxy(ctx, k, bin, dir, up, ps.dns.Addr)
		}
	} else {
		p, err = startSmokescreen(ctx, k, bin, dir)
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("peers: %w", ctx.Err())
	case err != nil:
		ps.skipped[k.name] = "did not start: " + err.Error()
	default:
		ps.procs[k.name] = p
	}
	return nil
}

// stop stops every peer and their DNS stub; it returns how each that did not
// exit 0 ended.
func (ps *peerSet) stop() map[string]string {
	if ps == nil {
		return nil
	}
	out := map[string]string{}
	for _, p := range ps.procs {
		if msg := p.stop(); msg != "" {
			out[p.kind.name] = msg
		}
	}
	if ps.dns != nil {
		ps.dns.Close()
		ps.dns = nil
	}
	return out
}

// spawnPeer starts bin with args in dir, without the environment's proxy
// settings: a peer must dial the upstream itself.
func spawnPeer(k peerKind, bin, dir string, args []string) (*peerProc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = withoutProxyEnv(os.Environ())
	c, err := startChild(cmd, filepath.Join(dir, k.name+".stdout"), filepath.Join(dir, k.name+".log"))
	if err != nil {
		return nil, err
	}
	return &peerProc{child: c, kind: k}, nil
}

func withoutProxyEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"http_proxy", "https_proxy", "all_proxy", "no_proxy"}, strings.ToLower(k))
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
	p, err := spawnPeer(k, bin, dir, []string{"-listen", "127.0.0.1:0", "-ca-cert", caCert, "-ca-key", caKey,
		"-mitm-hosts", transformHost, "-upstream-ca", upCA, "-resolver", dnsAddr,
		"-max-idle-per-host", strconv.Itoa(peerMaxIdlePerHost)})
	if err != nil {
		return nil, err
	}
	p.roots = roots
	err = p.waitFor(ctx, "its listening line", func() bool {
		addr := listeningLine(p.outPath)
		p.proxyURL = "http://" + addr
		return addr != "" && loopbackOnly(addr) == nil
	})
	return p, err
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

// startSmokescreen runs smokescreen on a free port of 127.0.0.1, allowing
// 127.0.0.0/8, and waits until the port accepts.
func startSmokescreen(ctx context.Context, k peerKind, bin, dir string) (*peerProc, error) {
	cfg := filepath.Join(dir, "smokescreen.yaml") // only the pool size, which has no flag
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "# Generated by egressd's bench for one run.\ntransport_max_idle_conns_per_host: %d\n", peerMaxIdlePerHost), 0o600); err != nil {
		return nil, err
	}
	var err error
	for range peerStartAttempts {
		var ports []int
		var p *peerProc
		if ports, err = egressdtest.FreePorts(1); err != nil {
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		p, err = spawnPeer(k, bin, dir, []string{"--config-file", cfg, "--listen-ip", "127.0.0.1",
			"--listen-port", strconv.Itoa(ports[0]), "--allow-range", "127.0.0.0/8"})
		if err != nil {
			return nil, err
		}
		p.proxyURL = "http://" + addr
		if err = p.waitFor(ctx, "its port "+addr, func() bool { return accepts(addr) }); err == nil || ctx.Err() != nil {
			return p, err
		}
	}
	return nil, err
}

func accepts(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// waitFor polls ready until it holds, within startTimeout; it stops the peer
// when it fails.
func (p *peerProc) waitFor(ctx context.Context, what string, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for !ready() {
		if err := p.pause(ctx, what); err != nil {
			p.stop()
			return fmt.Errorf("%w%s", err, p.logTail())
		}
	}
	return nil
}

func (p *peerProc) peakRSS() int64 {
	n, _ := procfs.PeakRSS(p.pid())
	return n
}

// writePeerCA makes a throwaway CA for goproxybare's interception and writes
// its certificate and key into dir.
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
	err = os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certPath, keyPath, ca.Pool, err
}

// peerResult is one peer on one path: its runs, one per round, each right
// after that round's egressd run.
type peerResult struct {
	Peer string `json:"peer"`
	// Skipped says why the peer has no figures: it did not start, or
	// (NotApplicable) it does not intercept.
	Skipped       string        `json:"skipped,omitempty"`
	NotApplicable bool          `json:"not_applicable,omitempty"`
	Run           runResult     `json:"run"`
	Ratio         float64       `json:"ratio"`
	CPUPerReqUS   float64       `json:"cpu_us_per_req"`
	Rounds        []roundResult `json:"rounds,omitempty"`
	PeakRSSBytes  int64         `json:"peak_rss_after_bytes"` // VmHWM after the path
	runs          []runResult
}

// pathPeers collects one path's peer runs over its rounds.
type pathPeers struct {
	ps      *peerSet
	p       pathSpec
	results []peerResult
}

// forPath is what measurePath needs for p's peers; nil (a no-op) for none.
func (ps *peerSet) forPath(p pathSpec) *pathPeers {
	if ps == nil || p.peers == peersNone {
		return nil
	}
	pp := &pathPeers{ps: ps, p: p}
	for _, k := range ps.order {
		r := peerResult{Peer: k.name, Skipped: ps.skipped[k.name]}
		if p.peers == peersIntercept && k.noMITM != "" {
			r.Skipped, r.NotApplicable = k.noMITM, true
		}
		pp.results = append(pp.results, r)
	}
	return pp
}

// round runs the path through every peer that carries it; direct is the
// round's direct run.
func (pp *pathPeers) round(ctx context.Context, w *world, lo loadOptions, direct runResult) error {
	if pp == nil {
		return nil
	}
	for i := range pp.results {
		r := &pp.results[i]
		if r.Skipped != "" {
			continue
		}
		proc := pp.ps.procs[r.Peer]
		t := pp.p.viaProxy(w)
		t.proxy = proc.proxyURL
		if pp.p.peers == peersIntercept {
			t.roots = proc.roots
		}
		x, err := runCounted(ctx, t, lo, w.up, proc.cpuTime)
		if err != nil {
			return fmt.Errorf("through %s: %w", r.Peer, err)
		}
		r.Rounds, r.runs = append(r.Rounds, newRound(direct, x)), append(r.runs, x)
	}
	return nil
}

// finish folds the rounds and reads each peer's peak RSS.
func (pp *pathPeers) finish() []peerResult {
	if pp == nil {
		return nil
	}
	for i := range pp.results {
		if r := &pp.results[i]; len(r.runs) > 0 {
			r.Run = combine(r.runs)
			r.Ratio, r.CPUPerReqUS = roundMedians(r.Rounds)
			r.PeakRSSBytes = pp.ps.procs[r.Peer].peakRSS()
		}
	}
	return pp.results
}

// peerInfo is one peer of the run: its binary, or why it was skipped, its peak
// RSS and how it exited.
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
	rss := map[string]int64{}
	for n, p := range ps.procs {
		rss[n] = p.peakRSS() // before it exits
	}
	exits := ps.stop()
	var out []peerInfo
	for _, k := range ps.order {
		out = append(out, peerInfo{Peer: k.name, Binary: ps.bins[k.name], Skipped: ps.skipped[k.name],
			PeakRSSBytes: rss[k.name], Exit: exits[k.name]})
	}
	return out
}

// Bounds on a child's lifecycle, so a broken build cannot hang the bench.
const (
	startTimeout = 10 * time.Second
	// stopTimeout: every client connection is closed by SIGTERM, so a drain
	// has nothing to wait for.
	stopTimeout = 10 * time.Second
)

// child is a process the bench starts (a peer; egressd and Vault are
// internal/testutil's): in its own process group, so Ctrl-C reaches only the
// bench, which stops it with SIGTERM; Pdeathsig stops it if the bench dies.
type child struct {
	cmd              *exec.Cmd
	outPath, logPath string        // its stdout and stderr
	exited           chan struct{} // closed once reaped
	exitErr          error
	stopOnce         sync.Once
	stopMsg          string
}

func startChild(cmd *exec.Cmd, outPath, logPath string) (*child, error) {
	c := &child{cmd: cmd, outPath: outPath, logPath: logPath, exited: make(chan struct{})}
	stdout, err := os.Create(outPath)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// pause sleeps a little, failing if the process has exited or the wait is over.
func (c *child) pause(ctx context.Context, waitingFor string) error {
	select {
	case <-c.exited:
		return fmt.Errorf("exited while waiting for %s: %v", waitingFor, c.exitErr)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", waitingFor, ctx.Err())
	case <-time.After(20 * time.Millisecond):
		return nil
	}
}

// stop sends SIGTERM, waits up to stopTimeout, then kills. It runs once and
// returns "" when the process exited 0, otherwise how it ended.
func (c *child) stop() string {
	c.stopOnce.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
			if c.exitErr != nil {
				c.stopMsg = "after SIGTERM: " + c.exitErr.Error()
			}
		case <-time.After(stopTimeout):
			_ = c.cmd.Process.Kill()
			<-c.exited
			c.stopMsg = fmt.Sprintf("still running %s after SIGTERM; killed", stopTimeout)
		}
	})
	return c.stopMsg
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) cpuTime() (time.Duration, error) { return procfs.CPU(c.pid()) }

// logTail is the end of its stderr, for an error message.
func (c *child) logTail() string {
	b, _ := os.ReadFile(c.logPath)
	if len(b) == 0 {
		return ""
	}
	return "; it said:\n" + string(b[max(0, len(b)-1000):])
}
