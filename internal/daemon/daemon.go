// Package daemon is a running egressd: it loads and validates the config (Load), builds
// the Runtime, the interception CA, the hook signer and the credential store from it
// (New, Start), serves the listeners, the admin endpoints and the DNS guard until the
// context ends (Run), reloads on SIGHUP, POST /v1/reload or a file change, and drains
// (Close). The credential store outlives reloads while its backend and IDs are
// unchanged; a reload that fails leaves everything as it was. Package main only parses
// flags and wires signals to it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
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

// Daemon is a running egressd: its listeners, proxy server and admin server.
type Daemon struct {
	cfgPath string
	log     zerolog.Logger
	metrics *metrics.Metrics

	mu         sync.Mutex
	current    *Loaded
	loadedAt   time.Time
	lastReload admin.ReloadStatus // the last reload's outcome
	self       []netip.AddrPort

	srv   *proxy.Server
	admin *http.Server
	errc  chan error

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

// New returns a Daemon for the config at cfgPath ("" for the quick-start defaults),
// logging to log; Start puts a config loaded from it in force.
func New(cfgPath string, log zerolog.Logger, m *metrics.Metrics) *Daemon {
	return &Daemon{cfgPath: cfgPath, log: log, metrics: m}
}

// Self is egressd's own bound addresses (the DNS guard's, then the listeners' in
// config order, then the admin listener's), which the guard never lets a request reach.
func (d *Daemon) Self() []netip.AddrPort { return slices.Clone(d.self) }

// UnsafeWarning is logged at start, and by a reload that turns the setting on.
const UnsafeWarning = "network.unsafe_allow_cidrs is set: internal addresses it names are reachable; for development and tests only"

// Start opens the listeners and serves config l (from Load(cfgPath)): the CA, the
// credential store and the Runtime are built first, and any failure closes what was
// opened.
func (d *Daemon) Start(l *Loaded) error {
	d.setMemoryLimits(l.Cfg.Limits)
	lns, err := d.listen(l)
	if err != nil {
		return err
	}
	if d.leaves, err = newLeaves(l.Cfg, d.metrics); err != nil {
		closeAll(lns)
		return err
	}
	rt, err := d.runtimeFor(l)
	if err != nil {
		closeAll(lns)
		return err
	}
	if rt.Guard.Unsafe() {
		d.log.Warn().Msg(UnsafeWarning)
	}
	for _, w := range l.Cfg.Warnings {
		d.log.Warn().Str("path", w.Path).Msg(w.Msg)
	}
	d.current, d.loadedAt, d.boot = l, time.Now(), l.Cfg
	d.watch = newWatcher(d.cfgPath, l)
	for _, ev := range []string{hooks.EventPre, hooks.EventPost} {
		for _, o := range proxy.HookOutcomes {
			d.metrics.HookRequests.WithLabelValues(ev, o)
		}
	}
	d.srv = proxy.New(rt, d.log, d.metrics)
	d.store.Subscribe(d.srv.CredentialChanged)
	d.errc = make(chan error, len(lns)+1)
	for i, ln := range lns[:len(l.Cfg.Listeners)] {
		d.srv.InitMetrics(l.Cfg.Listeners[i])
		go func() { d.errc <- d.srv.Serve(ln, l.Cfg.Listeners[i]) }()
	}
	if len(lns) > len(l.Cfg.Listeners) {
		d.serveAdmin(lns[len(lns)-1])
	}
	if err := d.serveDNS(l); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watch.run(ctx, d.reloadIfChanged)
	d.log.Info().Str("environment", l.Cfg.Environment).Str("config_hash", l.Cfg.Hash).Msg("egressd started")
	return nil
}

// listen opens every sandbox listener and then the admin listener (last), and records
// their bound addresses as egressd's own, which the guard never lets a request reach.
func (d *Daemon) listen(l *Loaded) ([]net.Listener, error) {
	var lns []net.Listener
	addrs := make([]netip.AddrPort, 0, len(l.Cfg.Listeners)+1)
	for _, lc := range l.Cfg.Listeners {
		addrs = append(addrs, lc.Address)
	}
	if l.Cfg.Admin.Address.IsValid() {
		addrs = append(addrs, l.Cfg.Admin.Address)
	}
	if dl, err := netip.ParseAddrPort(l.Cfg.DNS.Listen); err == nil {
		d.self = append(d.self, dl) // the DNS guard's TCP side is egressd's own too
	}
	for i, a := range addrs {
		name, key := "admin", "admin.address"
		if i < len(l.Cfg.Listeners) {
			name, key = l.Cfg.Listeners[i].Name, fmt.Sprintf("listeners[%d].address", i)
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

func (d *Daemon) serveAdmin(ln net.Listener) {
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
func (d *Daemon) serveDNS(l *Loaded) error {
	if l.Cfg.DNS.Listen == "" {
		return nil
	}
	rt := d.srv.Runtime()
	g := dnsguard.New(dnsguard.Options{
		Listen:   l.Cfg.DNS.Listen,
		Policy:   func() *allowlist.Policy { return d.srv.Runtime().Policy },
		Resolver: rt.Resolver,
		Guard:    rt.Guard,
		Current: func() (*netguard.Resolver, *netguard.Guard) {
			rt := d.srv.Runtime()
			return rt.Resolver, rt.Guard
		},
		Log:               d.log,
		Timeout:           l.Cfg.Limits.DNS,
		MaxTCPConnections: l.Cfg.DNS.MaxTCPConnections,
		MaxTCPPerClient:   l.Cfg.DNS.MaxTCPPerClient,
		TCPIdle:           l.Cfg.DNS.TCPIdle,
		TCPMaxQueries:     l.Cfg.DNS.TCPMaxQueries,
	})
	if err := g.Listen(); err != nil {
		return err
	}
	d.log.Info().Str("listener", "dns").Str("address", g.Addr()).Msg("listening")
	go func() { d.errc <- g.Run(context.Background()) }()
	return nil
}

// Run serves until ctx ends (drain, then nil) or a listener fails (drain, then its
// error). Each signal on hup reloads, as SIGHUP does.
func (d *Daemon) Run(ctx context.Context, hup <-chan os.Signal) error {
	for {
		select {
		case <-hup:
			d.reload(ReloadSignal)
		case <-ctx.Done():
			d.Close()
			return nil
		case err := <-d.errc:
			if err != nil {
				d.log.Error().Err(err).Msg("listener failed")
				d.Close()
				return err
			}
		}
	}
}

// Hangup is the reload a SIGHUP runs, synchronously; see Reload.
func (d *Daemon) Hangup() (string, error) { return d.reload(ReloadSignal) }

// runtimeFor builds the Runtime for l, reusing the running credential store when
// the backend and the credential IDs are unchanged, so a reload keeps last good values.
// A new store replaces the running one only once the Runtime has been built: a reload
// that fails leaves the store, and so the credentials served, as they were.
func (d *Daemon) runtimeFor(l *Loaded) (*proxy.Runtime, error) {
	if d.signer == nil {
		signer, err := hooks.NewSignerFromConfig(l.Cfg.Hooks.SigningKey, l.Cfg.StateDir, &d.live)
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
	if d.srv != nil { // a reload: at start, Start subscribes once the Server exists
		store.Subscribe(d.srv.CredentialChanged)
	}
	return rt, nil
}

// withPlaceholders gives rt the policy's placeholder replacer (the derivation key is
// loaded, or created, in state_dir: run writes it, check does not).
func (d *Daemon) withPlaceholders(l *Loaded, rt *proxy.Runtime) error {
	ph, err := Placeholders(l, &d.live)
	rt.Placeholders = ph
	return err
}

// Close drains: in-flight requests get limits.drain, then every connection is closed,
// the watcher and the credential refreshers stop, and the log is flushed.
func (d *Daemon) Close() {
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
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}
