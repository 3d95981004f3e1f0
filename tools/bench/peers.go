package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/proc"
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
	scriptOff    = "off" // the -peers value that skips the peers
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

func (k peerKind) key() string { return k.name }

// peerUse is which peers a path runs through.
type peerUse int

const (
	peersNone      peerUse = iota
	peersTunnel            // every peer: absolute-form HTTP or a CONNECT tunnel
	peersIntercept         // only the peers with MITM
)

// parsePeers parses -peers: "off", or peer names, each once.
func parsePeers(list string) ([]peerKind, error) {
	if list = strings.TrimSpace(list); list == scriptOff {
		return nil, nil
	}
	return pick("-peers", list, peerKinds, peerKind.key)
}

// findPeers builds the peers with peersScript: each one's binary, or why it
// is skipped.
func findPeers(ctx context.Context, kinds []peerKind, stderr io.Writer) (bins, skips map[string]string, err error) {
	bins, skips = map[string]string{}, map[string]string{}
	build := names(kinds, peerKind.key)
	if _, err := os.Stat(peersScript); err != nil {
		for _, n := range build {
			skips[n] = "no " + peersScript + " in the working directory (run from the repository root)"
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

// peerProc is one running peer (internal/testutil/proc), SIGTERMed should
// the bench die.
type peerProc struct {
	*proc.Proc
	outPath, logPath string // its stdout and stderr
	kind             peerKind
	proxyURL         string         // http://127.0.0.1:port
	roots            *x509.CertPool // what clients of its intercepted tunnels trust
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
	ps := &peerSet{procs: map[string]*peerProc{}, order: o.peers}
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
	p := &peerProc{outPath: filepath.Join(dir, k.name+".stdout"), logPath: filepath.Join(dir, k.name+".log"), kind: k}
	var err error
	p.Proc, err = proc.Start(cmd, p.outPath, p.logPath, syscall.SIGTERM)
	return p, err
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
		if err := p.Pause(ctx, 20*time.Millisecond); err != nil {
			p.stop()
			return fmt.Errorf("waiting for %s: %w; it said:\n%s", what, err, proc.Tail(p.logPath, 1000))
		}
	}
	return nil
}

func (p *peerProc) peakRSS() int64 {
	n, _ := procfs.PeakRSS(p.Pid())
	return n
}

// writePeerCA makes a throwaway CA for goproxybare's interception and writes
// its certificate and key into dir.
func writePeerCA(dir string) (certPath, keyPath string, roots *x509.CertPool, err error) {
	ca, err := testpki.NewCA("egressd bench peer CA (goproxy)")
	if err != nil {
		return "", "", nil, err
	}
	certPath, keyPath = filepath.Join(dir, "goproxy-ca.pem"), filepath.Join(dir, "goproxy-ca-key.pem")
	err = errors.Join(os.WriteFile(certPath, ca.PEM(), 0o600), os.WriteFile(keyPath, ca.KeyPEM(), 0o600))
	return certPath, keyPath, ca.Pool, err
}

// legs is p's peer rows: a leg for each peer that carries it, and a row of
// each (with Skipped set for those that do not), in -peers order.
func (ps *peerSet) legs(ctx context.Context, p pathSpec, w *world, lo loadOptions) (legs []leg, rows []*rowBuilder) {
	if ps == nil || p.peers == peersNone {
		return nil, nil
	}
	for _, k := range ps.order {
		rb := newRow(k.name, "", "")
		rows = append(rows, rb)
		switch peer := ps.procs[k.name]; {
		case p.peers == peersIntercept && k.noMITM != "":
			rb.res.Skipped, rb.res.NotApplicable = k.noMITM, true
		case peer == nil:
			rb.res.Skipped = ps.skipped[k.name]
		default:
			t := p.viaProxy(w)
			t.proxy = peer.proxyURL
			if p.peers == peersIntercept {
				t.roots = peer.roots
			}
			legs = append(legs, leg{row: rb, peer: peer,
				run: func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, t, lo, w.up, cpu) }})
		}
	}
	return legs, rows
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

// Bounds on a peer's lifecycle, so a broken build cannot hang the bench.
const (
	startTimeout = 10 * time.Second
	// stopTimeout: every client connection is closed by SIGTERM, so a drain
	// has nothing to wait for.
	stopTimeout = 10 * time.Second
)

func (p *peerProc) stop() string { return p.Stop(stopTimeout) }

func (p *peerProc) cpuTime() (time.Duration, error) { return procfs.CPU(p.Pid()) }
