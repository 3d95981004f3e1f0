// Package daemon is a running egressd: it loads and validates the config (Load), builds
// the Snapshot, the interception CA, the hook signer and the credential store from it
// (New, Start), serves the listeners, the admin endpoints and the DNS guard until the
// context ends (Run), reloads on SIGHUP, POST /v1/reload or a file change, and drains
// (Close). The credential store outlives reloads while its backend and IDs are
// unchanged; a reload that fails leaves everything as it was. Package main only parses
// flags and wires signals to it.
package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/admin"
	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/keep"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/node"
	"github.com/egressd/egressd/internal/proxy"
	"github.com/egressd/egressd/internal/sockets"
	mitm "github.com/egressd/egressd/internal/tls"
)

// drainTimeout bounds how long a reload keeps the previous Snapshot's upstream
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

	srv    *proxy.Server
	admin  *http.Server // the admin listener's; nil when off
	health *http.Server // the health listener's; nil unless admin.health_address
	errc   chan error

	leaves *mitm.Leaves  // the CA is fixed for the process's life
	signer *hooks.Signer // the hook signing key, likewise
	creds  creds         // the credential store, kept across reloads while storeKey is unchanged

	// reloadMu serialises reloads (SIGHUP, POST /v1/reload, a file change): one runs
	// at a time and the others wait for it.
	reloadMu sync.Mutex
	// boot is the config egressd started with: the settings that need a restart
	// (restartKeys) keep its values across reloads.
	boot      *config.Config
	watch     *watcher           // polls the config's files; see watch.go
	stopWatch context.CancelFunc // stops the watcher
	stopDNS   context.CancelFunc // stops the DNS guard

	// inherited holds the sockets a supervising parent passed (UseSockets); nil
	// when this process opens its own.
	inherited *sockets.Set
	keep      *keep.Keeper     // see UseKeeper; nil: nothing outlives this process
	live      netguard.SelfSet // node mode: sandboxes' listeners in egressd's own namespace
	hold      context.Context  // see HoldUntilReady; nil: serve at once
	serving   []net.Listener   // the proxy's listeners, which Close stops first

	registry *node.Registry        // node mode's sandboxes; nil in a sidecar
	vaults   *vaultSessions        // node mode's Vault sessions, shared by its sandboxes
	stopNode func(context.Context) // stops the node API and the watcher, drains the sandboxes
}

// New returns a Daemon for the config at cfgPath ("" for the quick-start defaults),
// logging to log; Start puts a config loaded from it in force.
func New(cfgPath string, log zerolog.Logger, m *metrics.Metrics) *Daemon {
	return &Daemon{cfgPath: cfgPath, log: log, metrics: m}
}

// UseSockets makes Start serve the sockets of set, which a supervising parent
// holds (sockets.FromEnv), instead of opening its own: they outlive this process.
// A socket the config names that set lacks (the config changed since the parent
// opened them) is opened here, with a warning; one set has that the config does
// not name is closed here, with a warning (the parent keeps it open).
func (d *Daemon) UseSockets(set *sockets.Set) { d.inherited = set }

// UseKeeper makes node mode leave with the supervising parent (k) the sockets it
// opens in sandboxes' namespaces, the node API's socket and the sandbox specs in
// force, and take back at start what a previous worker left: a worker's death
// then frees no sandbox's port and forgets no registration.
func (d *Daemon) UseKeeper(k *keep.Keeper) { d.keep = k }

// Self is egressd's own bound addresses (the DNS guard's, then the listeners' in
// config order, then the admin listener's), which the guard never lets a request reach.
func (d *Daemon) Self() []netip.AddrPort { return slices.Clone(d.self) }

// UnsafeWarning is logged at start, and by a reload that turns the setting on.
const UnsafeWarning = "network.unsafe_allow_cidrs is set: internal addresses it names are reachable; for development and tests only"

// Start opens the listeners and serves config l (from Load(cfgPath)): the CA, the
// credential store and the Snapshot are built first, and any failure closes what was
// opened.
func (d *Daemon) Start(l *Loaded) error {
	d.setMemoryLimits(l.Cfg.Limits)
	socks, err := d.listen(l)
	if err != nil {
		return err
	}
	if d.leaves, err = newLeaves(l.Cfg, d.metrics); err != nil {
		socks.Close()
		return err
	}
	d.metrics.CAExpiry.Set(float64(d.leaves.CA().Cert.NotAfter.Unix()))
	d.writePublicCA(l.Cfg)
	snap, err := d.runtimeFor(l)
	if err != nil {
		socks.Close()
		return err
	}
	if snap.Guard.Unsafe() {
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
	d.srv = proxy.New(snap, d.log, d.metrics)
	d.creds.store.Subscribe(d.srv.CredentialChanged)
	d.metrics.ObserveCredentials(d.credentialReady)
	if d.hold != nil {
		d.WaitReady(d.hold)
	}
	d.errc = make(chan error, socks.Len()+1)
	for _, lc := range l.Cfg.Listeners {
		ln, err := admitPeers(socks.Get(sockets.TCP, listenerSocket(lc.Name)).Listener(), "", lc, d.log)
		if err != nil {
			return err
		}
		d.srv.InitMetrics(lc)
		d.serving = append(d.serving, ln)
		go func() { d.errc <- d.srv.Serve(ln, lc) }()
	}
	if err := d.serveAdmin(socks); err != nil {
		return err
	}
	if err := d.serveDNS(l, socks.Get(sockets.UDP, dnsSocket), socks.Get(sockets.TCP, dnsSocket)); err != nil {
		return err
	}
	if err := d.startNode(l.Cfg.Node); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	go d.watch.run(ctx, d.reloadIfChanged)
	d.log.Info().Str("environment", l.Cfg.Environment).Str("config_hash", l.Cfg.Hash).Int("pid", os.Getpid()).
		Msg("egressd started")
	return nil
}

// writePublicCA writes the CA's public files (the certificate, the merged bundle, the
// PKCS#12 trust store) where every user can read them, as `egressd ca init` does, so a
// sandbox running as another user trusts egressd without a step of its own. A failure
// is a warning: clients may trust the CA by other means.
func (d *Daemon) writePublicCA(cfg *config.Config) {
	pub, err := mitm.WritePublic(d.leaves.CA(), cfg.TLS.CAPublicDir, cfg.StateDir)
	if err != nil {
		d.log.Warn().Err(err).Str("dir", cfg.TLS.CAPublicDir).Msg("cannot write the CA's public files (tls.ca_public_dir)")
		return
	}
	d.log.Info().Str("bundle", pub.Bundle).Str("trust_store", pub.TrustStore).Msg("CA public files written")
}

// listen opens (or, under a supervisor, takes) every socket l serves, logs each
// listener's bound address, and records the bound addresses as egressd's own,
// which the guard never lets a request reach: the DNS guard's, the listeners' in
// config order, the admin listener's.
func (d *Daemon) listen(l *Loaded) (*sockets.Set, error) {
	socks, opened, err := OpenSockets(d.cfgPath, l, d.inherited)
	if err != nil {
		return nil, err
	}
	d.warnUnheld(opened)
	if dns := socks.Get(sockets.TCP, dnsSocket); dns != nil {
		d.self = append(d.self, dns.Addr)
	}
	for _, sp := range socketSpecs(l) {
		if sp.Network == sockets.TCP && sp.Name != dnsSocket {
			bound := socks.Get(sockets.TCP, sp.Name).Addr
			d.log.Info().Str("listener", sp.listener).Str("address", bound.String()).Msg("listening")
			d.self = append(d.self, bound)
		}
	}
	return socks, nil
}

// warnUnheld warns, under a supervisor, about the sockets this process opened
// itself (the parent holds none for them) and closes those the parent holds that
// the config no longer names.
func (d *Daemon) warnUnheld(opened []sockets.Spec) {
	if d.inherited == nil {
		return
	}
	for _, sp := range opened {
		d.log.Warn().Str("socket", sp.String()).
			Msg("not among the sockets the supervisor holds (the config changed since egressd started): opened by this worker, it closes if the worker stops; restart egressd to apply")
	}
	for _, s := range d.inherited.Rest() {
		d.log.Warn().Str("socket", s.Spec.String()).
			Msg("held by the supervisor but no longer in the config: not served; restart egressd to release it")
		s.Close()
	}
}

// serveAdmin serves the admin listener (admin.address) and, when it has its own,
// the health listener (admin.health_address), on their TCP sockets from socks or
// on the Unix sockets they name. With admin.token, every admin request needs it.
func (d *Daemon) serveAdmin(socks *sockets.Set) error {
	a := d.boot.Admin
	ln, err := d.adminListener(socks, adminSocket, a.Socket, "admin.address")
	if err != nil {
		return err
	}
	if ln != nil {
		h := admin.Handler(d, d.metrics, !a.SeparateHealth())
		if a.Pprof {
			h = admin.WithPprof(h)
		}
		if a.Token != (config.SecretRef{}) {
			h = admin.WithToken(h, secretToken("admin.token", a.Token, &d.creds.live))
		}
		d.admin = d.serveHTTP(h, ln)
	}
	ln, err = d.adminListener(socks, healthSocket, a.HealthSocket, "admin.health_address")
	if ln != nil {
		d.health = d.serveHTTP(admin.Health(d, d.metrics), ln)
	}
	return err
}

// adminListener is the admin or health listener: the Unix socket at path, or the
// TCP socket name of socks (nil when it has none).
func (d *Daemon) adminListener(socks *sockets.Set, name, path, key string) (net.Listener, error) {
	if path != "" {
		ln, err := listenUnix(path, key)
		if err == nil {
			d.log.Info().Str("listener", name).Str("address", config.UnixPrefix+path).Msg("listening")
		}
		return ln, err
	}
	if s := socks.Get(sockets.TCP, name); s != nil {
		return s.Listener(), nil
	}
	return nil, nil
}

func (d *Daemon) serveHTTP(h http.Handler, ln net.Listener) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.errc <- err
		}
	}()
	return srv
}

// serveDNS starts the DNS guard on its sockets, udp and tcp (nil unless dns.listen
// is set).
func (d *Daemon) serveDNS(l *Loaded, udp, tcp *sockets.Socket) error {
	if udp == nil || tcp == nil {
		return nil
	}
	stop, err := startDNS(l, d.srv, udp.PacketConn(), tcp.Listener(), d.log, d.errc)
	d.stopDNS = stop
	return err
}

// startDNS starts l's DNS guard on pc and ln, answering from srv's current
// Snapshot's policy, resolver and guard, so a reload applies to the next query. Its
// end (an error, or nil once stopped) goes to errc.
func startDNS(l *Loaded, srv *proxy.Server, pc net.PacketConn, ln net.Listener, log zerolog.Logger, errc chan<- error) (context.CancelFunc, error) {
	snap := srv.Snapshot()
	g := dnsguard.New(dnsguard.Options{
		Listen:     l.Cfg.DNS.Listen,
		PacketConn: pc,
		Listener:   ln,
		Policy:     func() *allowlist.Policy { return srv.Snapshot().Policy },
		Resolver:   snap.Resolver,
		Guard:      snap.Guard,
		Current: func() (*netguard.Resolver, *netguard.Guard) {
			snap := srv.Snapshot()
			return snap.Resolver, snap.Guard
		},
		Sinkhole:          l.Cfg.DNS.RefusedNames == config.RefusedNamesSinkhole,
		Log:               log,
		Timeout:           l.Cfg.Limits.DNS,
		MaxTCPConnections: l.Cfg.DNS.MaxTCPConnections,
		MaxTCPPerClient:   l.Cfg.DNS.MaxTCPPerClient,
		TCPIdle:           l.Cfg.DNS.TCPIdle,
		TCPMaxQueries:     l.Cfg.DNS.TCPMaxQueries,
	})
	if err := g.Listen(); err != nil {
		return nil, err
	}
	log.Info().Str("listener", "dns").Str("address", g.Addr()).Msg("listening")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errc <- g.Run(ctx) }()
	return cancel, nil
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

// runtimeFor builds the Snapshot for l over the Daemon's credential store (creds.snapshot),
// making the hook signer at the first call.
func (d *Daemon) runtimeFor(l *Loaded) (*proxy.Snapshot, error) {
	if d.signer == nil {
		signer, err := hooks.NewSignerFromConfig(l.Cfg.Hooks.SigningKey, l.Cfg.StateDir, &d.creds.live)
		if err != nil {
			return nil, err
		}
		d.signer = signer
	}
	var follow func(string)
	if d.srv != nil { // a reload: at start, Start subscribes once the Server exists
		follow = d.srv.CredentialChanged
	}
	return d.creds.snapshot(l, d.shared(), follow)
}

// shared is what the Daemon's Snapshots, and its sandboxes', are built with.
func (d *Daemon) shared() shared {
	return shared{self: d.self, live: &d.live, leaves: d.leaves, signer: d.signer, log: d.log, m: d.metrics, node: d.srv, vaults: d.vaults}
}

// drainSettle is how long Close lets the connections accepted just before it
// become requests before the drain begins (bounded by half of limits.drain).
const drainSettle = 500 * time.Millisecond

// settle stops accepting, then gives the connections accepted just before the
// time to become requests, which the drain then waits for: a request head still
// arriving, a tunnel whose first request has not come yet (a hook call between
// its CONNECT and its POST). The drain alone would close them unanswered. Under
// the supervisor, new connections go meanwhile to the sockets' other holders: a
// worker started by an upgrade, or the backlog.
func (d *Daemon) settle(drain time.Duration) {
	for _, ln := range d.serving {
		ln.Close()
	}
	if len(d.serving) > 0 {
		time.Sleep(min(drainSettle, drain/2))
	}
}

// Close drains: it stops accepting and lets the connections accepted just before
// become requests (settle), then in-flight requests get limits.drain, then every
// connection is closed, the watcher and the credential refreshers stop, and the
// log is flushed.
func (d *Daemon) Close() {
	drain := d.srv.Snapshot().Limits.Drain
	d.log.Info().Dur("drain_timeout", drain).Msg("draining")
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if d.stopWatch != nil {
		d.stopWatch()
	}
	if d.stopDNS != nil {
		// The DNS guard's queries are answered at once: nothing to drain. A new
		// worker (an upgrade) answers the next ones from the same sockets.
		d.stopDNS()
	}
	for _, srv := range []*http.Server{d.admin, d.health} {
		if srv != nil {
			srv.Close()
		}
	}
	var sandboxes sync.WaitGroup // node mode's drain beside the node's own
	if d.stopNode != nil {
		sandboxes.Go(func() { d.stopNode(ctx) })
	}
	d.settle(drain)
	if err := d.srv.Shutdown(ctx); err != nil {
		d.log.Warn().Err(err).Msg("drain timed out; open connections closed")
	}
	sandboxes.Wait()
	d.creds.close()
	d.log.Info().Msg("egressd stopped")
	os.Stdout.Sync() // the log: every record is written by now (Shutdown waited)
}
