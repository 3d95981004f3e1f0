// Command bench measures what egressd costs on the request path: it runs the same
// load directly against an in-process upstream and then through an egressd
// subprocess, back to back in one run, and prints throughput, latency and
// egressd's CPU per request as a ratio to the direct run. All traffic stays on
// 127.0.0.0/8 (the transparent path's, in network namespaces of its own:
// transparent.go), and every load loop is bounded in both time and request count.
//
//	go run ./tools/bench -egressd bin/egressd [-duration 4s] [-rounds 1] [-clients 64] [-size 1024] [-paths plain,connect,...] [-vaultdev PATH|off] [-peers goproxy,smokescreen|off] [-idle-tunnels N] [-json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/hookflood"
)

// Exit codes: the report was printed and no request failed; it was printed but
// some requests failed (or egressd exited badly); the run could not be made.
const (
	exitOK     = 0
	exitErrors = 1
	exitSetup  = 2
)

// Defaults, chosen to match the conditions issue 8's peer figures were taken
// under: 64 keep-alive clients, 1 KiB responses, HTTP/1.1. Six paths, each
// run direct and through egressd for warm-up plus window, take about 65 s.
const (
	defaultDuration = 4 * time.Second
	defaultWarmup   = time.Second
	defaultClients  = 64
	defaultSize     = 1024
	defaultRounds   = 1
	defaultPaths    = "plain,connect,intercept,intercept-newconn,intercept-resume,credential,oauth2,vault,placeholder,hook,transparent"

	// maxDuration, maxClients and maxRounds keep a mistyped flag from turning
	// the bench into a long or huge load.
	maxDuration = 5 * time.Minute
	maxClients  = 4096
	maxSize     = 64 << 20
	maxRounds   = 25
)

// options are the parsed flags.
type options struct {
	egressd  string
	duration time.Duration
	warmup   time.Duration
	clients  int
	size     int
	rounds   int
	paths    []pathSpec
	json     bool
	keep     bool
	vaultdev string // the Vault dev server binary; "" finds it, vaultdevOff skips
	// idleTunnels is how many tunnels the idle-tunnels path opens (idle.go).
	idleTunnels int
	// peers are the peer proxies measured beside egressd (peers.go); nil
	// with -peers off.
	peers []peerSpec
}

func main() {
	hookflood.MainIfChild() // the hook-attack row's flood runs in a child (hookattack.go)
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "bench:", err)
		}
		return exitSetup
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, opts, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitSetup
	}
	if opts.json {
		err = rep.writeJSON(stdout)
	} else {
		err = rep.writeText(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitSetup
	}
	if rep.failed() {
		return exitErrors
	}
	return exitOK
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var paths, peers string
	fs.StringVar(&o.egressd, "egressd", "", "path to the egressd binary (required)")
	fs.DurationVar(&o.duration, "duration", defaultDuration, "measured time per run (each path runs direct, then through egressd)")
	fs.DurationVar(&o.warmup, "warmup", defaultWarmup, "unmeasured warm-up before each run")
	fs.IntVar(&o.clients, "clients", defaultClients, "concurrent clients, each with its own keep-alive connection")
	fs.IntVar(&o.size, "size", defaultSize, "response body size in bytes")
	fs.IntVar(&o.rounds, "rounds", defaultRounds, "direct/egressd run pairs per path, alternated; the report gives the median ratio")
	fs.StringVar(&paths, "paths", defaultPaths, "comma-separated paths to measure: "+strings.Join(pathNames(), ", "))
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.IntVar(&o.idleTunnels, "idle-tunnels", defaultIdleTunnels, fmt.Sprintf("idle CONNECT tunnels the %s path opens (1 to %d)", idlePathName, maxIdleTunnels))
	fs.StringVar(&peers, "peers", peersDefault, "peer proxies measured beside egressd on the paths they can carry, each as NAME or NAME=BINARY ("+strings.Join(peerKindNames(), ", ")+"); default binaries: what "+peersScript+" build prints, when run from the repository root; \""+peersOff+"\" measures none")
	fs.BoolVar(&o.keep, "keep", false, "keep the temp dir (egressd config and log) and print its path")
	fs.StringVar(&o.vaultdev, "vaultdev", "", "Vault dev server binary for the vault path; default: what "+vaultdevScript+" build prints, when run from the repository root; \""+vaultdevOff+"\" skips the path")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./tools/bench -egressd bin/egressd [flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.paths, err = lookupPaths(paths); err != nil {
		return o, err
	}
	if o.peers, err = parsePeers(peers); err != nil {
		return o, err
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	return o, o.absEgressd()
}

func (o options) validate() error {
	switch {
	case o.egressd == "":
		return errors.New("-egressd is required, e.g. -egressd bin/egressd (make build)")
	case o.duration <= 0 || o.duration > maxDuration:
		return fmt.Errorf("-duration %s: want more than 0 and at most %s", o.duration, maxDuration)
	case o.warmup < 0 || o.warmup > maxDuration:
		return fmt.Errorf("-warmup %s: want 0 to %s", o.warmup, maxDuration)
	case o.clients < 1 || o.clients > maxClients:
		return fmt.Errorf("-clients %d: want 1 to %d", o.clients, maxClients)
	case o.size < 0 || o.size > maxSize:
		return fmt.Errorf("-size %d: want 0 to %d", o.size, maxSize)
	case o.rounds < 1 || o.rounds > maxRounds:
		return fmt.Errorf("-rounds %d: want 1 to %d", o.rounds, maxRounds)
	case o.idleTunnels < 1 || o.idleTunnels > maxIdleTunnels:
		return fmt.Errorf("-idle-tunnels %d: want 1 to %d", o.idleTunnels, maxIdleTunnels)
	}
	if _, err := os.Stat(o.egressd); err != nil {
		return fmt.Errorf("-egressd: %w (run make build first)", err)
	}
	return nil
}

// absEgressd makes -egressd absolute: egressd runs in the temp dir, where a
// relative path would name nothing.
func (o *options) absEgressd() error {
	abs, err := filepath.Abs(o.egressd)
	if err != nil {
		return fmt.Errorf("-egressd: %w", err)
	}
	o.egressd = abs
	return nil
}

// run is the whole bench: upstream, DNS stub, egressd, then each path direct
// and through egressd. Everything it starts is stopped before it returns.
func run(ctx context.Context, o options, stderr io.Writer) (*report, error) {
	dir, err := os.MkdirTemp("", "egressd-bench-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		fmt.Fprintln(stderr, "bench: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	up, err := startUpstream(o.size)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	defer up.close()
	if needsHook(o.paths) { // before egressd: its config names the endpoint
		if up.hook, err = startHookServer(up); err != nil {
			return nil, fmt.Errorf("hook endpoint: %w", err)
		}
		defer up.hook.close()
	}
	dns, err := startDNS()
	if err != nil {
		return nil, fmt.Errorf("DNS stub: %w", err)
	}
	defer dns.Close()
	prepareIdleTunnels(o) // before egressd, which inherits the fd limit
	cfg, files := benchConfig(up, dns.Addr, nil, benchMaxConnections)
	e, err := startEgressd(ctx, o.egressd, dir, cfg, files)
	if err != nil {
		return nil, fmt.Errorf("egressd: %w", err)
	}
	defer e.stop()
	w := &world{up: up, proxy: e.proxyURL}
	if intercepts(o.paths) {
		if w.egressdRoots, err = e.CAPool(); err != nil {
			return nil, err
		}
	}
	var vaultBin, vaultSkip string
	if needsVault(o.paths) {
		if vaultBin, vaultSkip, err = findVaultdev(ctx, o.vaultdev, stderr); err != nil {
			return nil, err
		}
	}
	peers, err := startPeers(ctx, o, dir, up, stderr) // nil with -peers off or no path they carry
	if err != nil {
		return nil, err
	}
	defer peers.stop()
	w.peers = peers
	var vs *vaultStack // started before the first vault path, so idle during the others
	rep := newReport(o)
	for _, p := range o.paths {
		pw, pe := w, e
		if p.vault {
			if vaultSkip != "" {
				rep.Paths = append(rep.Paths, pathResult{Path: p.name, Description: p.desc, Skipped: vaultSkip})
				continue
			}
			if vs == nil {
				if vs, err = startVaultStack(ctx, o, vaultBin, dir, up, dns.Addr); err != nil {
					return nil, fmt.Errorf("%s: %w", p.name, err)
				}
				defer vs.stop()
			}
			pw, pe = vs.w, vs.e
		}
		if p.measure != nil {
			rs, err := p.measure(ctx, pathEnv{w: pw, e: pe, dns: dns, o: o, dir: dir, stderr: stderr})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			rep.Paths = append(rep.Paths, rs...)
			continue
		}
		r, err := measurePath(ctx, pw, pe, dns, p, o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		rep.Paths = append(rep.Paths, r)
	}
	rep.Peers = peers.infos() // stops them
	if vs != nil {
		rep.VaultEgressdExit = vs.stop()
	}
	rep.PeakRSSBytes, rep.RSSError = e.peakRSS()
	if lc, err := e.leafCache(); err != nil {
		rep.LeafCacheError = err.Error()
	} else {
		rep.LeafCache = &lc
	}
	rep.EgressdExit = e.stop()
	return rep, nil
}

// measurePath runs one path o.rounds times, each round direct then through
// egressd with the same settings, and checks on every run that the upstream
// received exactly what egressd had to inject.
func measurePath(ctx context.Context, w *world, e *egressd, dns *dnsstub.Server, p pathSpec, o options) (pathResult, error) {
	lo := loadOptions{clients: o.clients, size: o.size, warmup: o.warmup, duration: o.duration}
	res := pathResult{Path: p.name, Description: p.desc, NewConnPerRequest: p.newConn}
	if p.inject != injectNone {
		res.Injects = p.inject.String()
	}
	leafBefore, leafErr := e.leafCache()
	dnsBefore := int64(dns.Total())
	pp := w.peers.forPath(p) // nil unless the path has peers
	var directs, vias []runResult
	for round := range o.rounds {
		d, err := runLoad(ctx, p.direct(w), lo, w.up, nil)
		if err != nil {
			return res, fmt.Errorf("direct: %w", err)
		}
		from := e.LogSize()
		x, err := runLoad(ctx, p.viaProxy(w), lo, w.up, e.cpuTime)
		if err != nil {
			return res, fmt.Errorf("through egressd: %w", err)
		}
		log, err := e.scanLog(from)
		if err != nil {
			return res, fmt.Errorf("egressd log: %w", err)
		}
		res.Log.merge(log)
		res.Problems = append(res.Problems, injectionProblems(p, round, o.rounds, d, x)...)
		res.Problems = append(res.Problems, scrubProblems(p, x, log)...)
		res.Rounds = append(res.Rounds, newRound(d, x))
		directs, vias = append(directs, d), append(vias, x)
		if err := pp.round(ctx, w, lo, d); err != nil { // after egressd's run, against the same direct run
			return res, err
		}
	}
	res.Direct, res.Egressd = combine(directs), combine(vias)
	res.finish()
	res.Peers = pp.finish()
	res.DNSQueries = int64(dns.Total()) - dnsBefore
	if leafErr == nil {
		var after leafCounts
		if after, leafErr = e.leafCache(); leafErr == nil {
			lc := after.sub(leafBefore)
			res.LeafCache = &lc
		}
	}
	if leafErr != nil {
		res.LeafCacheError = leafErr.Error()
	}
	res.PeakRSSBytes, _ = e.peakRSS()
	return res, nil
}

// scrubProblems checks that on the credential paths, whose upstream reflects the
// Authorization it receives, egressd scrubbed the response of every request.
func scrubProblems(p pathSpec, via runResult, log logSummary) []string {
	if p.inject != injectCredential && p.inject != injectVaultCredential {
		return nil
	}
	if log.Scrubbed != via.UpstreamRequests {
		return []string{fmt.Sprintf("egressd run: %d of %d responses reflecting the credential were scrubbed", log.Scrubbed, via.UpstreamRequests)}
	}
	return nil
}

// injectionProblems checks one round's runs against what the path injects: the
// direct run must reach the upstream with nothing injected, the run through
// egressd with every request carrying p.inject, and nothing else.
func injectionProblems(p pathSpec, round, rounds int, direct, via runResult) []string {
	var out []string
	label := func(run string) string {
		if rounds > 1 {
			return fmt.Sprintf("%s run, round %d", run, round+1)
		}
		return run + " run"
	}
	counts := func(r runResult) map[injection]int64 {
		return map[injection]int64{injectTransform: r.Transformed, injectCredential: r.Credentialed, injectVaultCredential: r.VaultCredentialed, injectOAuth: r.OAuthCredentialed}
	}
	for kind, n := range counts(direct) {
		if n > 0 {
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s, which only egressd sets", label("direct"), n, direct.UpstreamRequests, kind))
		}
	}
	for kind, n := range counts(via) {
		switch {
		case kind == p.inject && (n != via.UpstreamRequests || n == 0):
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s as configured", label("egressd"), n, via.UpstreamRequests, kind))
		case kind != p.inject && n > 0:
			out = append(out, fmt.Sprintf("%s: %d of %d upstream requests carried %s, which this path's entry does not set", label("egressd"), n, via.UpstreamRequests, kind))
		}
	}
	slices.Sort(out)
	return out
}
