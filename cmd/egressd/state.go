package main

import (
	"time"

	"github.com/egressd/egressd/internal/proxy"
)

// Runtime, ConfigInfo and Ready make the daemon the admin endpoints' State.

func (d *daemon) Runtime() *proxy.Runtime { return d.srv.Runtime() }

func (d *daemon) ConfigInfo() (string, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.current.cfg.Hash, d.loadedAt
}

// Ready reports readiness: the config is loaded and every credential the policy
// references can be served; the body has each credential's state (never a value).
func (d *daemon) Ready() (bool, map[string]any) {
	d.mu.Lock()
	store := d.store
	d.mu.Unlock()
	return store.Ready(), map[string]any{"config": "loaded", "credentials": store.Status()}
}

// reload validates the config and policy anew and swaps them in; an invalid new
// config is rejected and the running one stays in force. Listener addresses are
// fixed at start: a change to them needs a restart.
func (d *daemon) reload() error {
	l, err := load(d.cfgPath)
	if err == nil {
		var rt *proxy.Runtime
		d.mu.Lock()
		rt, err = d.runtimeFor(l)
		d.mu.Unlock()
		if err == nil {
			old := d.srv.Swap(rt)
			old.Close()
			d.mu.Lock()
			d.current, d.loadedAt = l, time.Now()
			d.mu.Unlock()
			d.metrics.ConfigReloads.WithLabelValues("ok").Inc()
			d.log.Info().Str("config_hash", l.cfg.Hash).Msg("config reloaded")
			return nil
		}
	}
	d.metrics.ConfigReloads.WithLabelValues("error").Inc()
	d.log.Error().Err(err).Msg("reload rejected; the running config stays in force")
	return err
}

// JWKS is the hook signing keys' public half, for /.well-known/jwks.json.
func (d *daemon) JWKS() []byte { return d.signer.JWKS() }

// CAPEM is the interception CA certificate, for /ca.pem.
func (d *daemon) CAPEM() []byte { return d.leaves.CA().CertPEM }
