// Command bench measures what egressd costs on the request path: it runs the same
// load directly against an in-process upstream and then through an egressd
// subprocess (and its peer proxies), back to back in one run, and prints
// throughput, latency and CPU per request as ratios to the direct run. All
// traffic stays on 127.0.0.0/8 (the transparent path's, in network namespaces
// of its own), and every load loop is bounded in both time and request count.
//
//	go run ./tools/bench -egressd bin/egressd [-duration 4s] [-rounds 1] [-paths plain,connect,...] [-peers goproxy,smokescreen|off] [-json]
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

	"github.com/egressd/egressd/internal/testutil/hookflood"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// Exit codes: the report was printed and nothing failed; it was printed but
// something failed; the run could not be made.
const (
	exitOK     = 0
	exitErrors = 1
	exitSetup  = 2
)

// The defaults: 64 keep-alive clients and 1 KiB responses over HTTP/1.1, the
// conditions the peers are compared under (tools/bench/README.md).
const (
	defaultPaths = "plain,connect,intercept,intercept-newconn,intercept-resume,credential,oauth2,github_app,vault,placeholder,aws,hook,transparent,node"
	// The maxima keep a mistyped flag from turning the bench into a long or huge load.
	maxDuration = 5 * time.Minute
	maxClients  = 4096
	maxSize     = 64 << 20
	maxRounds   = 25
)

// options are the parsed flags.
type options struct {
	egressd          string
	duration, warmup time.Duration
	clients, size    int
	rounds           int
	paths            []pathSpec
	json, keep       bool
	peers            []peerKind // nil with -peers off
	args             []string   // as given
}

func (o options) load() loadOptions {
	return loadOptions{clients: o.clients, size: o.size, warmup: o.warmup, duration: o.duration}
}

func main() {
	hookflood.MainIfChild() // the hook-attack row's flood runs in a child
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
	if err == nil {
		if opts.json {
			err = rep.writeJSON(stdout)
		} else {
			err = rep.writeText(stdout)
		}
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "bench:", err)
		return exitSetup
	case rep.failed():
		return exitErrors
	}
	return exitOK
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := options{args: args}
	var pathList, peers string
	fs.StringVar(&o.egressd, "egressd", "", "path to the egressd binary (required)")
	fs.DurationVar(&o.duration, "duration", 4*time.Second, "measured time per run (each path runs direct, then through egressd)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up before each run")
	fs.IntVar(&o.clients, "clients", 64, "concurrent clients, each with its own keep-alive connection")
	fs.IntVar(&o.size, "size", 1024, "response body size in bytes")
	fs.IntVar(&o.rounds, "rounds", 1, "direct/egressd run pairs per path, alternated; the report gives the median ratio")
	fs.StringVar(&pathList, "paths", defaultPaths, "comma-separated paths to measure: "+strings.Join(names(paths, pathSpec.key), ", "))
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.StringVar(&peers, "peers", peersDefault, "peer proxies measured beside egressd on the paths they can carry ("+strings.Join(names(peerKinds, peerKind.key), ", ")+"), built by "+peersScript+" from the repository root; \""+scriptOff+"\" measures none")
	fs.BoolVar(&o.keep, "keep", false, "keep the temp dir (egressd config and log) and print its path")
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
	if o.paths, err = lookupPaths(pathList); err != nil {
		return o, err
	}
	if o.peers, err = parsePeers(peers); err != nil {
		return o, err
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	// egressd runs in the temp dir, where a relative path would name nothing.
	o.egressd, err = filepath.Abs(o.egressd)
	return o, err
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
	}
	if _, err := os.Stat(o.egressd); err != nil {
		return fmt.Errorf("-egressd: %w (run make build first)", err)
	}
	return nil
}

// run is the whole bench: the world (upstream, DNS stub, egressd, peers), then
// each path. Everything it starts is stopped before it returns.
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
	env := pathEnv{o: o, dir: dir, stderr: stderr}
	stop, err := startWorld(ctx, &env)
	defer stop()
	if err != nil {
		return nil, err
	}
	rep := newReport(o)
	for _, p := range o.paths {
		rs, err := measure(ctx, env, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		rep.Paths = append(rep.Paths, rs...)
	}
	rep.Peers = env.w.peers.stop()
	if rep.PeakRSSBytes, err = procfs.PeakRSS(env.e.ServingPid()); err != nil {
		rep.RSSError = err.Error()
	}
	if lc, err := env.e.leafCache(); err != nil {
		rep.LeafCacheError = err.Error()
	} else {
		rep.LeafCache = &lc
	}
	rep.EgressdExit = env.e.stop()
	return rep, nil
}

// startWorld starts what every path shares into env; stop stops what started.
func startWorld(ctx context.Context, env *pathEnv) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	o := env.o
	up, err := startUpstream(o.size)
	if err != nil {
		return stop, fmt.Errorf("upstream: %w", err)
	}
	stops = append(stops, up.close)
	// The hook endpoint starts before egressd: its config names the endpoint.
	if slices.ContainsFunc(o.paths, func(p pathSpec) bool { return p.name == "hook" }) {
		if up.hook, err = startHookServer(up); err != nil {
			return stop, fmt.Errorf("hook endpoint: %w", err)
		}
		stops = append(stops, up.hook.close)
	}
	if env.dns, err = startDNS(); err != nil {
		return stop, fmt.Errorf("DNS stub: %w", err)
	}
	stops = append(stops, func() { env.dns.Close() })
	cfg, files := benchConfig(up, env.dns.Addr, nil, benchMaxConnections)
	if env.e, err = startEgressd(ctx, o.egressd, env.dir, cfg, files); err != nil {
		return stop, fmt.Errorf("egressd: %w", err)
	}
	stops = append(stops, func() { env.e.stop() })
	env.w = &world{up: up, proxy: env.e.proxyURL}
	if env.w.egressdRoots, err = env.e.CAPool(); err != nil {
		return stop, err
	}
	env.w.peers, err = startPeers(ctx, o, env.dir, up, env.stderr) // nil with -peers off or no path they carry
	stops = append(stops, func() { env.w.peers.stop() })
	return stop, err
}

// measure runs one path: through an egressd of its own, by its own measure
// function, or as the direct/egressd pair.
func measure(ctx context.Context, env pathEnv, p pathSpec) ([]pathResult, error) {
	switch {
	case p.own != nil:
		return measureOwn(ctx, env, p)
	case p.measure != nil:
		return p.measure(ctx, env)
	}
	r, err := measurePath(ctx, env, p)
	return []pathResult{r}, err
}
