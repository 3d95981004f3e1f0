package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/egressd/egressd/internal/admin"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/proxy"
)

// Snapshot, ConfigInfo, Ready and Reload make the Daemon the admin endpoints' State.

func (d *Daemon) Snapshot() *proxy.Snapshot { return d.srv.Snapshot() }

func (d *Daemon) ConfigInfo() (string, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.current.Cfg.Hash, d.loadedAt
}

// LastReload is the last reload's outcome, for /healthz and /readyz.
func (d *Daemon) LastReload() admin.ReloadStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastReload
}

func (d *Daemon) setLastReload(source string, err error) {
	st := admin.ReloadStatus{Result: "ok", Source: source, At: time.Now().UTC()}
	if err != nil {
		st.Result, st.Error = "error", err.Error()
	}
	d.mu.Lock()
	d.lastReload = st
	d.mu.Unlock()
}

// Ready reports readiness: the config is loaded and the listeners serve (Start
// serves them before the admin and health listeners answer); with
// readiness.require_credentials, also every credential the policy references can be
// served. The body has each credential's state (never a value) and "unrestricted":
// true when the policy has no "network" (every destination allowed).
func (d *Daemon) Ready() (bool, map[string]any) {
	d.mu.Lock()
	cur := d.current
	d.mu.Unlock()
	creds := d.credentialStates()
	body := map[string]any{"config": "loaded", "listeners": "serving", "credentials": creds}
	if cur.Policy.Unrestricted {
		body["unrestricted"] = true
	}
	if !cur.Cfg.Readiness.RequireCredentials {
		return true, body
	}
	for _, st := range creds {
		if !st.Ready {
			return false, body
		}
	}
	return true, body
}

// credentialStates is each credential's state, as the store has it and with an
// oauth2 credential ready only while it holds an access token, and pending (no
// error yet) while its first token call is to come or in flight.
func (d *Daemon) credentialStates() map[string]credential.Status {
	d.mu.Lock()
	store := d.creds.store
	d.mu.Unlock()
	states := store.Status()
	tokens := d.creds.live.p.Load()
	for id, st := range states {
		if st.Ready && !tokens.Ready(id) {
			st.Ready, st.Error = false, credential.CauseNoAccessToken
			if tokens.Pending(id) {
				st.Pending, st.Error = true, ""
			}
			states[id] = st
		}
	}
	return states
}

// credentialReady is credential_ready's source: each credential, servable now.
func (d *Daemon) credentialReady() map[string]bool {
	out := map[string]bool{}
	for id, st := range d.credentialStates() {
		out[id] = st.Ready
	}
	return out
}

// readyPoll is how often WaitReady asks Ready.
const readyPoll = 50 * time.Millisecond

// WaitReady waits until the first reads of every credential are done and Ready
// says ready (true), or ctx ends (false).
func (d *Daemon) WaitReady(ctx context.Context) bool {
	d.mu.Lock()
	store := d.creds.store
	d.mu.Unlock()
	select {
	case <-store.FirstRead():
	case <-ctx.Done():
		return false
	}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for {
		if ok, _ := d.Ready(); ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// HoldUntilReady makes Start wait, once it has built everything and before it
// serves, until Ready says ready or ctx ends: a worker started for an upgrade
// takes no connection before its credentials are read, while the old worker
// serves them all.
func (d *Daemon) HoldUntilReady(ctx context.Context) { d.hold = ctx }

// What started a reload, as the reload log lines' source field says.
const (
	ReloadSignal = "sighup"
	ReloadAdmin  = "admin" // POST /v1/reload
	ReloadFile   = "file"  // the watcher saw a file change
)

// Reload is POST /v1/reload: the reload SIGHUP runs, synchronously. It returns the
// hash of the config now in force, or a *config.ValidationError saying why the new
// config was rejected; the running config then stays in force.
func (d *Daemon) Reload() (string, error) { return d.reload(ReloadAdmin) }

// reload validates the config, its policy and hooks.json anew and builds the Snapshot
// from them; only when every step succeeds is the Snapshot swapped in, atomically.
// Requests in flight finish on the Snapshot they started with; each new request,
// including each request inside an intercepted tunnel, takes the new one, and the
// swap decides open tunnels and upgraded connections again, closing those the new
// one refuses (proxy.Server.Swap). Any failure leaves the running config in force:
// a reload never fails open.
//
// Settings that shape what is built once at start (restartKeys) cannot change by
// reload: a reload that changes one logs a warning naming it ("needs a restart"),
// keeps the value egressd started with, and applies the rest.
//
// Reloads are serialised: a reload waits for the one running to finish.
func (d *Daemon) reload(source string) (string, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	return d.reloadLocked(source)
}

// reloadIfChanged is the watcher's reload: it runs only if a watched file still differs
// from what the last reload read, since a SIGHUP or POST may have applied the change
// while the watcher waited for the file to settle.
func (d *Daemon) reloadIfChanged() {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	if file := d.watch.changed(); file != "" {
		d.log.Info().Str("file", file).Msg("config file changed; reloading")
		d.reloadLocked(ReloadFile)
	}
}

func (d *Daemon) reloadLocked(source string) (string, error) {
	read := d.watch.observeAll() // before loading: a change after this is seen again
	c, err := d.prepare()
	if err != nil {
		verr := rejection(d.cfgPath, c.l, err)
		d.watch.rejected(read, verr)
		d.metrics.ConfigReloads.WithLabelValues("error").Inc()
		d.log.Error().Str("source", source).Err(verr).Strs("problems", problemStrings(verr)).
			Msg("reload rejected; the running config stays in force")
		d.setLastReload(source, verr)
		return "", verr
	}
	old := d.apply(c.l, c.snap)
	d.watch.reset(d.cfgPath, c.l, read)
	d.metrics.ConfigReloads.WithLabelValues("ok").Inc()
	d.setLastReload(source, nil)
	d.logReloaded(source, c, old)
	return c.l.Cfg.Hash, nil
}

// candidate is a config a reload has Loaded, and what it would put in force.
type candidate struct {
	l        *Loaded // nil when the config could not be Loaded
	snap     *proxy.Snapshot
	restart  []string // settings kept at their start value (restartKeys)
	dnsGuard []string // settings the DNS guard keeps (dnsGuardKeys)
}

// prepare loads and validates the config and builds its Snapshot, with the settings
// that need a restart pinned to the values egressd started with.
func (d *Daemon) prepare() (candidate, error) {
	var c candidate
	var err error
	if c.l, err = Load(d.cfgPath); err != nil {
		return c, err
	}
	c.restart, c.dnsGuard = restartKeys(d.boot, c.l.Cfg), dnsGuardKeys(d.boot, c.l.Cfg)
	pinRestartKeys(c.l.Cfg, d.boot)
	d.mu.Lock()
	defer d.mu.Unlock()
	c.snap, err = d.runtimeFor(c.l)
	return c, err
}

// apply swaps snap in and returns the Snapshot it replaced, whose idle upstream
// connections it closes.
func (d *Daemon) apply(l *Loaded, snap *proxy.Snapshot) *proxy.Snapshot {
	d.mu.Lock()
	old := d.srv.Swap(snap)
	d.current, d.loadedAt = l, time.Now()
	d.mu.Unlock()
	old.Close()
	// Requests in flight at the swap hand their upstream connections back to the old
	// Snapshot's pool when they finish; sweep it again once they have had the drain
	// time, rather than leave those connections to the 90 s idle timeout.
	time.AfterFunc(drainTimeout, old.Close)
	return old
}

// logReloaded logs the reload that put c in force, with a summary of what is now
// enforced, then its warnings: the settings it could not apply, the unsafe switch
// turned on, the config's own warnings (as a start logs them).
func (d *Daemon) logReloaded(source string, c candidate, old *proxy.Snapshot) {
	l, snap := c.l, c.snap
	d.log.Info().Str("source", source).Str("config_hash", l.Cfg.Hash).
		Int("rules", len(l.Policy.Allowlist.Rules())).Int("hooks", hookCount(snap)).
		Strs("credentials", credentialIDs(l)).Msg("config reloaded")
	for _, k := range c.restart {
		d.log.Warn().Str("key", k).Msg("needs a restart: the reload keeps the value egressd started with")
	}
	for _, k := range c.dnsGuard {
		d.log.Warn().Str("key", k).Msg("needs a restart for the DNS guard: the proxy applies the new value, the DNS guard keeps the old one")
	}
	if snap.Guard.Unsafe() && !old.Guard.Unsafe() {
		d.log.Warn().Msg(UnsafeWarning)
	}
	for _, w := range l.Cfg.Warnings {
		d.log.Warn().Str("path", w.Path).Msg(w.Msg)
	}
}

func hookCount(snap *proxy.Snapshot) int {
	if snap.Hooks == nil {
		return 0
	}
	return snap.Hooks.Index.Len()
}

// JWKS is the hook signing keys' public half, for /.well-known/jwks.json.
func (d *Daemon) JWKS() []byte { return d.signer.JWKS() }

// CAPEM is the interception CA certificate, for /ca.pem.
func (d *Daemon) CAPEM() []byte { return d.leaves.CA().CertPEM }

// restartKeys names the settings of next that differ from running and that a reload
// cannot apply, because what they shape is built once at start: the sockets
// (listeners, admin.address, admin.health_address, dns.listen and the DNS guard's TCP bounds), how the DNS
// guard answers names off the allowlist (dns.refused_names), the interception CA and the hook signing key
// (tls.ca_cert, tls.ca_key, state_dir, hooks.signing_key), each listener's connection
// limit (limits.max_connections) and the logger (log.level, log.format).
func restartKeys(running, next *config.Config) []string {
	var keys []string
	diff := func(key string, changed bool) {
		if changed {
			keys = append(keys, key)
		}
	}
	if len(running.Listeners) != len(next.Listeners) {
		diff("listeners", true)
	} else {
		for i, lc := range running.Listeners {
			diff(fmt.Sprintf("listeners[%d]", i), !lc.Equal(next.Listeners[i]))
		}
	}
	ra, na := running.Admin, next.Admin
	diff("admin.address", ra.Address != na.Address || ra.Socket != na.Socket)
	diff("admin.health_address", ra.HealthAddress != na.HealthAddress || ra.HealthSocket != na.HealthSocket)
	diff("admin.exposed", ra.Exposed != na.Exposed)
	diff("admin.token", ra.Token != na.Token)
	diff("admin.pprof", ra.Pprof != na.Pprof)
	diff("dns.listen", running.DNS.Listen != next.DNS.Listen)
	diff("dns.refused_names", running.DNS.RefusedNames != next.DNS.RefusedNames)
	diff("dns.max_tcp_connections", running.DNS.MaxTCPConnections != next.DNS.MaxTCPConnections)
	diff("dns.max_tcp_per_client", running.DNS.MaxTCPPerClient != next.DNS.MaxTCPPerClient)
	diff("dns.tcp_idle", running.DNS.TCPIdle != next.DNS.TCPIdle)
	diff("dns.tcp_max_queries", running.DNS.TCPMaxQueries != next.DNS.TCPMaxQueries)
	diff("tls.ca_cert", running.TLS.CACert != next.TLS.CACert)
	diff("tls.ca_key", running.TLS.CAKey != next.TLS.CAKey)
	diff("tls.ca_public_dir", running.TLS.CAPublicDir != next.TLS.CAPublicDir)
	diff("state_dir", running.StateDir != next.StateDir)
	diff("hooks.signing_key", running.Hooks.SigningKey != next.Hooks.SigningKey)
	diff("limits.max_connections", running.Limits.MaxConnections != next.Limits.MaxConnections)
	diff("limits.leaf_mints", running.Limits.LeafMints != next.Limits.LeafMints)
	diff("log.level", running.Log.Level != next.Log.Level)
	diff("log.format", running.Log.Format != next.Log.Format)
	diff("node", running.Node != next.Node)
	return keys
}

// dnsGuardKeys names the settings of next, differing from running, that the DNS guard
// (when dns.listen is set) keeps until a restart: its per-query timeout. The policy,
// resolver and address guard it reads from the current Snapshot on every query.
func dnsGuardKeys(running, next *config.Config) []string {
	if running.DNS.Listen == "" || running.Limits.DNS == next.Limits.DNS {
		return nil
	}
	return []string{"limits.dns"}
}

// pinRestartKeys sets in next the values of running that a reload cannot change (see
// restartKeys; dnsGuardKeys are not pinned, the proxy applies them), so
// the Snapshot is built for what actually runs: hook traffic is told apart by the
// listeners that exist, and the credential store keeps the signing key's credential.
func pinRestartKeys(next, running *config.Config) {
	next.Listeners = running.Listeners
	next.Admin = running.Admin
	next.DNS = running.DNS
	next.TLS.CACert, next.TLS.CAKey, next.TLS.CAPublicDir = running.TLS.CACert, running.TLS.CAKey, running.TLS.CAPublicDir
	next.StateDir = running.StateDir
	next.Hooks.SigningKey = running.Hooks.SigningKey
	next.Limits.MaxConnections = running.Limits.MaxConnections
	next.Log = running.Log
	next.Node = running.Node
}

// rejection turns why a reload failed into the problems it reports: a config or policy
// validation error as it is; a hooks.json error as one problem per finding, located in
// its file; anything else as one problem, located as well as it can be. Problems hold
// paths and messages, never a secret's value.
func rejection(cfgPath string, l *Loaded, err error) *config.ValidationError {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		return verr
	}
	var perr *hooks.ParseError
	if errors.As(err, &perr) && l != nil {
		file, prefix := l.Cfg.Hooks.File, ""
		if file == "" {
			file, prefix = l.Cfg.Policy.File, "in "+config.HooksSourcePath+": "
		}
		ps := make([]config.Problem, 0, len(perr.Problems))
		for _, f := range perr.Problems {
			ps = append(ps, config.Problem{Path: f.Path, Msg: prefix + f.Msg, File: file})
		}
		return &config.ValidationError{Problems: ps}
	}
	p := config.Problem{Msg: err.Error()}
	var pathErr *fs.PathError
	switch {
	case l == nil: // the config file itself could not be read
		p.File = cfgPath
	case errors.As(err, &pathErr) && l.Cfg.Hooks.File != "" && pathErr.Path == l.Cfg.Hooks.File:
		p.Path, p.File, p.Msg = "hooks.file", pathErr.Path, "cannot read hooks.json: "+pathErr.Err.Error()
	}
	return &config.ValidationError{Problems: []config.Problem{p}}
}

func problemStrings(e *config.ValidationError) []string {
	out := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p.String()
	}
	return out
}
