// Command bench measures what egressd costs on the request path: it runs the same
// load directly against an in-process upstream and then through an egressd
// subprocess, back to back in one run, and prints throughput, latency and
// egressd's CPU per request as a ratio to the direct run. All traffic stays on
// 127.0.0.0/8, and every load loop is bounded in both time and request count.
//
//	go run ./bench -egressd bin/egressd [-duration 5s] [-clients 64] [-size 1024] [-paths plain,connect] [-json]
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
	"strings"
	"syscall"
	"time"
)

// Exit codes: the report was printed and no request failed; it was printed but
// some requests failed (or egressd exited badly); the run could not be made.
const (
	exitOK     = 0
	exitErrors = 1
	exitSetup  = 2
)

// Defaults, chosen to match the conditions issue 8's peer figures were taken
// under: 64 keep-alive clients, 1 KiB responses, HTTP/1.1.
const (
	defaultDuration = 5 * time.Second
	defaultWarmup   = time.Second
	defaultClients  = 64
	defaultSize     = 1024
	defaultPaths    = "plain,connect"

	// maxDuration and maxClients keep a mistyped flag from turning the bench
	// into a long or huge load.
	maxDuration = 5 * time.Minute
	maxClients  = 4096
	maxSize     = 64 << 20
)

// options are the parsed flags.
type options struct {
	egressd  string
	duration time.Duration
	warmup   time.Duration
	clients  int
	size     int
	paths    []pathSpec
	json     bool
	keep     bool
}

func main() {
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
	var paths string
	fs.StringVar(&o.egressd, "egressd", "", "path to the egressd binary (required)")
	fs.DurationVar(&o.duration, "duration", defaultDuration, "measured time per run (each path runs direct, then through egressd)")
	fs.DurationVar(&o.warmup, "warmup", defaultWarmup, "unmeasured warm-up before each run")
	fs.IntVar(&o.clients, "clients", defaultClients, "concurrent clients, each with its own keep-alive connection")
	fs.IntVar(&o.size, "size", defaultSize, "response body size in bytes")
	fs.StringVar(&paths, "paths", defaultPaths, "comma-separated paths to measure: "+strings.Join(pathNames(), ", "))
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	fs.BoolVar(&o.keep, "keep", false, "keep the temp dir (egressd config and log) and print its path")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./bench -egressd bin/egressd [flags]")
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

// run is the whole bench: upstream, egressd, then each path direct and through
// egressd. Everything it starts is stopped before it returns.
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
	e, err := startEgressd(ctx, o.egressd, dir, up)
	if err != nil {
		return nil, fmt.Errorf("egressd: %w", err)
	}
	defer e.stop()
	w := &world{up: up, proxy: e.proxyURL}
	rep := newReport(o)
	for _, p := range o.paths {
		r, err := measurePath(ctx, w, e, p, o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		rep.Paths = append(rep.Paths, r)
	}
	rep.PeakRSSBytes, rep.RSSError = e.peakRSS()
	rep.EgressdExit = e.stop()
	return rep, nil
}

// measurePath runs one path direct, then through egressd, with the same settings.
func measurePath(ctx context.Context, w *world, e *egressd, p pathSpec, o options) (pathResult, error) {
	lo := loadOptions{clients: o.clients, size: o.size, warmup: o.warmup, duration: o.duration}
	res := pathResult{Path: p.name, Description: p.desc}
	var err error
	if res.Direct, err = runLoad(ctx, p.direct(w), lo, w.up, nil); err != nil {
		return res, fmt.Errorf("direct: %w", err)
	}
	from := e.logSize()
	if res.Egressd, err = runLoad(ctx, p.viaProxy(w), lo, w.up, e.cpuTime); err != nil {
		return res, fmt.Errorf("through egressd: %w", err)
	}
	res.Log, err = e.scanLog(from)
	if err != nil {
		return res, fmt.Errorf("egressd log: %w", err)
	}
	res.finish()
	return res, nil
}
