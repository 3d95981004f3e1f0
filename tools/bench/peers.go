package main

import (
	"bytes"
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
	// Bounds on a peer's lifecycle, so a broken build cannot hang the bench.
	// Every client connection is closed by SIGTERM, so a drain has nothing to
	// wait for.
	peerStartTimeout = 10 * time.Second
	peerStopTimeout  = 10 * time.Second
)

// peerKind is one peer the bench knows: how it starts, and, for one without
// MITM, why it has no row on an intercepted path.
type peerKind struct {
	name, noMITM string
	start        func(ctx context.Context, p *peer, up *upstream) error
}

var peerKinds = []peerKind{
	{name: "goproxy", start: startGoproxy},
	{name: "smokescreen", start: startSmokescreen,
		noMITM: "run without MITM (its MITM needs an ACL file and a CA); intercepted paths are not measured for it"},
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

// peerInfo is one peer of the run: its binary, or why it was skipped, its peak
// RSS and how it exited.
type peerInfo struct {
	Peer         string `json:"peer"`
	Binary       string `json:"binary,omitempty"`
	Skipped      string `json:"skipped,omitempty"`
	PeakRSSBytes int64  `json:"peak_rss_bytes,omitempty"`
	Exit         string `json:"exit,omitempty"`
}

// peer is one peer of the run and, once started, its process
// (internal/testutil/proc), SIGTERMed should the bench die.
type peer struct {
	peerInfo
	kind             peerKind
	p                *proc.Proc
	dir              string
	outPath, logPath string          // its stdout and stderr
	proxyURL         string          // http://127.0.0.1:port
	roots            *x509.CertPool  // what clients of its intercepted tunnels trust
	dns              *dnsstub.Server // goproxy's own, so egressd's DNS counts stay its own
}

// peerSet is every peer -peers named, in that order.
type peerSet []*peer

// startPeers builds and starts the peers when a path needs them; one that
// cannot be built or started is skipped. Only an interrupt is an error.
func startPeers(ctx context.Context, o options, dir string, up *upstream, stderr io.Writer) (peerSet, error) {
	if len(o.peers) == 0 || !slices.ContainsFunc(o.paths, func(p pathSpec) bool { return p.peers != peersNone }) {
		return nil, nil
	}
	var ps peerSet
	for _, k := range o.peers {
		ps = append(ps, &peer{peerInfo: peerInfo{Peer: k.name}, kind: k, dir: filepath.Join(dir, "peers")})
	}
	if err := ps.build(ctx, stderr); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "peers"), 0o700); err != nil {
		return nil, err
	}
	for _, p := range ps {
		if p.Skipped != "" {
			continue
		}
		err := p.kind.start(ctx, p, up)
		if ctx.Err() != nil {
			ps.stop()
			return nil, fmt.Errorf("peers: %w", ctx.Err())
		}
		if err != nil {
			p.stop() // its DNS stub; spawn stopped the process
			p.Skipped = "did not start: " + err.Error()
		}
	}
	return ps, nil
}

// build runs peersScript for the peers: each one's Binary, or why it is skipped.
func (ps peerSet) build(ctx context.Context, stderr io.Writer) error {
	if _, err := os.Stat(peersScript); err != nil {
		for _, p := range ps {
			p.Skipped = "no " + peersScript + " in the working directory (run from the repository root)"
		}
		return nil
	}
	build := names(ps, func(p *peer) string { return p.Peer })
	fmt.Fprintf(stderr, "bench: peers: %s build %s (cached: instant; cold: under a minute each; -peers %s skips them)\n", peersScript, strings.Join(build, " "), scriptOff)
	bctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(bctx, peersScript, append([]string{"build"}, build...)...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, runErr := cmd.Output() // a failed peer prints no line
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	for line := range strings.Lines(string(out)) {
		if name, path, ok := strings.Cut(strings.TrimSpace(line), "="); ok && path != "" {
			if i := slices.Index(build, name); i >= 0 {
				ps[i].Binary = path
			}
		}
	}
	for _, p := range ps {
		if p.Binary == "" {
			p.Skipped = fmt.Sprintf("%s build failed (%v): %s", peersScript, runErr, lastLine(errOut.String()))
		}
	}
	return nil
}

// stop stops every peer and describes them; it returns nil for none. Call it
// once, after the last path.
func (ps peerSet) stop() []peerInfo {
	var out []peerInfo
	for _, p := range ps {
		p.stop()
		out = append(out, p.peerInfo)
	}
	return out
}

// stop reads the peer's peak RSS (before it exits) and stops it and its DNS stub.
func (p *peer) stop() {
	if p.p != nil {
		p.PeakRSSBytes, p.Exit = p.peakRSS(), p.p.Stop(peerStopTimeout)
		p.p = nil
	}
	if p.dns != nil {
		p.dns.Close()
		p.dns = nil
	}
}

// spawn starts the peer's binary with args in its dir, without the
// environment's proxy settings (a peer must dial the upstream itself), and
// waits until ready holds.
func (p *peer) spawn(ctx context.Context, what string, ready func() bool, args ...string) error {
	cmd := exec.Command(p.Binary, args...)
	cmd.Dir = p.dir
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"http_proxy", "https_proxy", "all_proxy", "no_proxy"}, strings.ToLower(k))
	})
	p.outPath, p.logPath = filepath.Join(p.dir, p.Peer+".stdout"), filepath.Join(p.dir, p.Peer+".log")
	var err error
	if p.p, err = proc.Start(cmd, p.outPath, p.logPath, syscall.SIGTERM); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, peerStartTimeout)
	defer cancel()
	for !ready() {
		if err := p.p.Pause(ctx, 20*time.Millisecond); err != nil {
			p.p.Stop(peerStopTimeout)
			p.p = nil
			return fmt.Errorf("waiting for %s: %w; it said:\n%s", what, err, proc.Tail(p.logPath, 1000))
		}
	}
	return nil
}

// startGoproxy runs goproxybare on 127.0.0.1:0 with a CA made for it now, and
// waits for its "listening ADDR" line.
func startGoproxy(ctx context.Context, p *peer, up *upstream) error {
	ca, err := testpki.NewCA("egressd bench peer CA (goproxy)")
	if err != nil {
		return err
	}
	if p.dns, err = startDNS(); err != nil {
		return err
	}
	p.roots = ca.Pool
	caCert, caKey, upCA := filepath.Join(p.dir, "goproxy-ca.pem"), filepath.Join(p.dir, "goproxy-ca-key.pem"), filepath.Join(p.dir, "upstream-ca.pem")
	if err := errors.Join(os.WriteFile(caCert, ca.PEM(), 0o600), os.WriteFile(caKey, ca.KeyPEM(), 0o600), os.WriteFile(upCA, up.caPEM, 0o600)); err != nil {
		return err
	}
	ready := func() bool {
		addr := listeningLine(p.outPath)
		p.proxyURL = "http://" + addr
		return addr != "" && loopbackOnly(addr) == nil
	}
	return p.spawn(ctx, "its listening line", ready, "-listen", "127.0.0.1:0", "-ca-cert", caCert, "-ca-key", caKey,
		"-mitm-hosts", transformHost, "-upstream-ca", upCA, "-resolver", p.dns.Addr, "-max-idle-per-host", strconv.Itoa(peerMaxIdlePerHost))
}

// listeningLine is the address in goproxybare's "listening ADDR" line, or "".
func listeningLine(path string) string {
	b, _ := os.ReadFile(path)
	for line := range strings.Lines(string(b)) {
		if addr, ok := strings.CutPrefix(line, "listening "); ok {
			return strings.TrimSpace(addr)
		}
	}
	return ""
}

// startSmokescreen runs smokescreen on a free port of 127.0.0.1, allowing
// 127.0.0.0/8, and waits until the port accepts.
func startSmokescreen(ctx context.Context, p *peer, _ *upstream) error {
	cfg := filepath.Join(p.dir, "smokescreen.yaml") // only the pool size, which has no flag
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "# Generated by egressd's bench for one run.\ntransport_max_idle_conns_per_host: %d\n", peerMaxIdlePerHost), 0o600); err != nil {
		return err
	}
	var err error
	for range peerStartAttempts {
		var ports []int
		if ports, err = egressdtest.FreePorts(1); err != nil {
			return err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		p.proxyURL = "http://" + addr
		accepts := func() bool {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		}
		err = p.spawn(ctx, "its port "+addr, accepts, "--config-file", cfg, "--listen-ip", "127.0.0.1",
			"--listen-port", strconv.Itoa(ports[0]), "--allow-range", "127.0.0.0/8")
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// rows is p's peer rows, in -peers order: a row through each peer that
// carries p, and one that is not measured, Skipped, for each other.
func (ps peerSet) rows(ctx context.Context, p pathSpec, w *world, lo loadOptions) []*row {
	if p.peers == peersNone {
		return nil
	}
	var rows []*row
	for _, peer := range ps {
		r := newRow(peer.Peer, "", "")
		switch {
		case p.peers == peersIntercept && peer.kind.noMITM != "":
			r.res.Skipped, r.res.NotApplicable = peer.kind.noMITM, true
		case peer.Skipped != "":
			r.res.Skipped = peer.Skipped
		default:
			t := p.viaProxy(w)
			t.proxy = peer.proxyURL
			if p.peers == peersIntercept {
				t.roots = peer.roots
			}
			r.peer = peer
			r.run = func(cpu cpuFunc) (runResult, error) { return runCounted(ctx, t, lo, w.up, cpu) }
		}
		rows = append(rows, r)
	}
	return rows
}

func (p *peer) cpuTime() (time.Duration, error) { return procfs.CPU(p.p.Pid()) }

func (p *peer) peakRSS() int64 {
	n, _ := procfs.PeakRSS(p.p.Pid())
	return n
}
