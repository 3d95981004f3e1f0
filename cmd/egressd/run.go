package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/admin"
	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
	mitm "github.com/egressd/egressd/internal/tls"
)

// drainTimeout bounds how long a reload keeps the previous Runtime's upstream
// connections for the requests that still use it.
const drainTimeout = 25 * time.Second

func cmdRun(args []string) int {
	fs, cfgPath, _ := newFlags("run", stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	l, err := load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	log := newLogger(l.cfg.Log)
	d := &daemon{cfgPath: *cfgPath, log: log, metrics: metrics.New(), sigs: make(chan os.Signal, 1)}
	// Take the signals before anything starts, so a SIGTERM or SIGHUP that arrives
	// during start-up is handled rather than killing the process.
	signal.Notify(d.sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := d.start(l); err != nil {
		log.Error().Err(err).Msg("egressd failed to start")
		return exitRuntime
	}
	return d.wait()
}

// daemon is a running egressd: its listeners, proxy server and admin server.
type daemon struct {
	cfgPath string
	log     zerolog.Logger
	metrics *metrics.Metrics

	mu         sync.Mutex
	current    *loaded
	loadedAt   time.Time
	lastReload admin.ReloadStatus // the last reload's outcome
	self       []netip.AddrPort

	srv   *proxy.Server
	admin *http.Server
	errc  chan error
	sigs  chan os.Signal

	leaves   *mitm.Leaves      // the CA is fixed for the process's life
	signer   *hooks.Signer     // the hook signing key, likewise
	live     liveStore         // the current store, for injectors and the signer
	store    *credential.Store // kept across reloads while storeKey is unchanged
	storeKey string
	stop     context.CancelFunc // stops the store's refreshers

	// reloadMu serialises reloads (SIGHUP, POST /v1/reload, a file change): one runs
	// at a time and the others wait for it.
	reloadMu sync.Mutex
	// boot is the config egressd started with: the settings that need a restart
	// (restartKeys) keep its values across reloads.
	boot      *config.Config
	watch     *watcher           // polls the config's files; see watch.go
	stopWatch context.CancelFunc // stops the watcher
}

// unsafeWarning is logged at start, and by a reload that turns the setting on.
const unsafeWarning = "network.unsafe_allow_cidrs is set: internal addresses it names are reachable; for development and tests only"

func (d *daemon) start(l *loaded) error {
	lns, err := d.listen(l)
	if err != nil {
		return err
	}
	if d.leaves, err = newLeaves(l.cfg, d.metrics); err != nil {
		closeAll(lns)
		return err
	}
	rt, err := d.runtimeFor(l)
	if err != nil {
		closeAll(lns)
		return err
	}
	if rt.Guard.Unsafe() {
		d.log.Warn().Msg(unsafeWarning)
	}
	for _, w := range l.cfg.Warnings {
		d.log.Warn().Str("path", w.Path).Msg(w.Msg)
	}
	d.current, d.loadedAt, d.boot = l, time.Now(), l.cfg
	d.watch = newWatcher(d.cfgPath, l)
	for _, ev := range []string{hooks.EventPre, hooks.EventPost} {
		for _, o := range proxy.HookOutcomes {
			d.metrics.HookRequests.WithLabelValues(ev, o)
		}
	}
	d.srv = proxy.New(rt, d.log, d.metrics)
	d.errc = make(chan error, len(lns)+1)
	for i, ln := range lns[:len(l.cfg.Listeners)] {
		d.srv.InitMetrics(l.cfg.Listeners[i])
		go func() { d.errc <- d.srv.Serve(ln, l.cfg.Listeners[i]) }()
	}
	if len(lns) > len(l.cfg.Listeners) {
		d.serveAdmin(lns[len(lns)-1])
	}
	if err := d.serveDNS(l); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watch.run(ctx, d.reloadIfChanged)
	d.log.Info().Str("environment", l.cfg.Environment).Str("config_hash", l.cfg.Hash).Msg("egressd started")
	return nil
}

// listen opens every sandbox listener and then the admin listener (last), and records
// their bound addresses as egressd's own, which the guard never lets a request reach.
func (d *daemon) listen(l *loaded) ([]net.Listener, error) {
	var lns []net.Listener
	addrs := make([]netip.AddrPort, 0, len(l.cfg.Listeners)+1)
	for _, lc := range l.cfg.Listeners {
		addrs = append(addrs, lc.Address)
	}
	if l.cfg.Admin.Address.IsValid() {
		addrs = append(addrs, l.cfg.Admin.Address)
	}
	if dl, err := netip.ParseAddrPort(l.cfg.DNS.Listen); err == nil {
		d.self = append(d.self, dl) // the DNS guard's TCP side is egressd's own too
	}
	for i, a := range addrs {
		name, key := "admin", "admin.address"
		if i < len(l.cfg.Listeners) {
			name, key = l.cfg.Listeners[i].Name, fmt.Sprintf("listeners[%d].address", i)
		}
		ln, err := net.Listen("tcp", a.String())
		if err != nil {
			closeAll(lns)
			return nil, listenError(name, key, d.cfgPath, err)
		}
		bound := netip.MustParseAddrPort(ln.Addr().String())
		d.log.Info().Str("listener", name).Str("address", bound.String()).Msg("listening")
		d.self = append(d.self, bound)
		lns = append(lns, ln)
	}
	return lns, nil
}

// listenError names the listener that could not listen, the config key of its
// address, and the fix for the common causes.
func listenError(name, key, cfgPath string, err error) error {
	where := key
	if cfgPath != "" {
		where += " in " + cfgPath
	}
	fix := "change " + where
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		fix = "another process holds the port (another egressd, or `make run`, still running?); stop it or " + fix
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		fix = "no interface has that address (a transparent listener needs the namespace's host-side address up first); " + fix
	case errors.Is(err, syscall.EACCES):
		fix = "ports below 1024 need CAP_NET_BIND_SERVICE; " + fix
	}
	return fmt.Errorf("listener %q (%s): %w: %s", name, key, err, fix)
}

func (d *daemon) serveAdmin(ln net.Listener) {
	h := admin.Handler(d, d.metrics)
	if d.boot.Admin.Pprof {
		h = admin.WithPprof(h)
	}
	d.admin = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := d.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.errc <- err
		}
	}()
}

// serveDNS starts the DNS guard when dns.listen is set. It answers from the current
// Runtime's policy, resolver and guard, so a reload applies to the next query.
func (d *daemon) serveDNS(l *loaded) error {
	if l.cfg.DNS.Listen == "" {
		return nil
	}
	rt := d.srv.Runtime()
	g := dnsguard.New(dnsguard.Options{
		Listen:   l.cfg.DNS.Listen,
		Policy:   func() *allowlist.Policy { return d.srv.Runtime().Policy },
		Resolver: rt.Resolver,
		Guard:    rt.Guard,
		Current: func() (*netguard.Resolver, *netguard.Guard) {
			rt := d.srv.Runtime()
			return rt.Resolver, rt.Guard
		},
		Log:               d.log,
		Timeout:           l.cfg.Limits.DNS,
		MaxTCPConnections: l.cfg.DNS.MaxTCPConnections,
		MaxTCPPerClient:   l.cfg.DNS.MaxTCPPerClient,
		TCPIdle:           l.cfg.DNS.TCPIdle,
		TCPMaxQueries:     l.cfg.DNS.TCPMaxQueries,
	})
	if err := g.Listen(); err != nil {
		return err
	}
	d.log.Info().Str("listener", "dns").Str("address", g.Addr()).Msg("listening")
	go func() { d.errc <- g.Run(context.Background()) }()
	return nil
}

// wait serves until SIGTERM/SIGINT (drain, exit 0) or a listener fails (exit 2).
// SIGHUP reloads.
func (d *daemon) wait() int {
	for {
		select {
		case sig := <-d.sigs:
			if sig == syscall.SIGHUP {
				d.reload(reloadSignal)
				continue
			}
			return d.shutdown()
		case err := <-d.errc:
			if err != nil {
				d.log.Error().Err(err).Msg("listener failed")
				d.shutdown()
				return exitRuntime
			}
		}
	}
}

// runtimeFor builds the Runtime for l, reusing the running credential store when
// the backend and the credential IDs are unchanged, so a reload keeps last good values.
// A new store replaces the running one only once the Runtime has been built: a reload
// that fails leaves the store, and so the credentials served, as they were.
func (d *daemon) runtimeFor(l *loaded) (*proxy.Runtime, error) {
	if d.signer == nil {
		signer, err := hooks.NewSignerFromConfig(l.cfg.Hooks.SigningKey, l.cfg.StateDir, &d.live)
		if err != nil {
			return nil, err
		}
		d.signer = signer
	}
	// The store is replaced only after the new Runtime built: a rejected reload
	// leaves the running policy on the running store.
	key := storeKey(l)
	if d.store != nil && key == d.storeKey {
		rt, err := buildRuntime(l, d.self, d.leaves, &d.live, d.signer)
		if err == nil {
			err = d.withPlaceholders(l, rt)
		}
		if err != nil {
			return nil, err
		}
		d.live.p.Load().SetClient(tokenClient(l, rt))
		return rt, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	store, tokens, err := newStore(ctx, l, d.log, d.metrics)
	if err != nil {
		cancel()
		return nil, err
	}
	rt, err := buildRuntime(l, d.self, d.leaves, &d.live, d.signer)
	if err == nil {
		err = d.withPlaceholders(l, rt)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	tokens.SetClient(tokenClient(l, rt))
	tokens.Start(ctx)
	if d.stop != nil {
		d.stop()
	}
	d.store, d.storeKey, d.stop = store, key, cancel
	d.live.p.Store(tokens)
	return rt, nil
}

// withPlaceholders gives rt the policy's placeholder replacer (the derivation key is
// loaded, or created, in state_dir: run writes it, check does not).
func (d *daemon) withPlaceholders(l *loaded, rt *proxy.Runtime) error {
	ph, err := placeholders(l, &d.live)
	rt.Placeholders = ph
	return err
}

func (d *daemon) shutdown() int {
	drain := d.srv.Runtime().Limits.Drain
	d.log.Info().Dur("drain_timeout", drain).Msg("draining")
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if d.stopWatch != nil {
		d.stopWatch()
	}
	if d.admin != nil {
		d.admin.Close()
	}
	if err := d.srv.Shutdown(ctx); err != nil {
		d.log.Warn().Err(err).Msg("drain timed out; open connections closed")
	}
	if d.stop != nil {
		d.stop()
	}
	d.log.Info().Msg("egressd stopped")
	os.Stdout.Sync() // the log: every record is written by now (Shutdown waited)
	return exitOK
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}
