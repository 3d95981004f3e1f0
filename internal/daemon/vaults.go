package daemon

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/vault"
)

// vaultSessions are a node's Vault sessions: the sandboxes whose credential scopes
// name the same Vault login (the node's credentials.vault, whatever their
// kv_prefix) share one vault.Session, so the node logs in once, renews one token,
// and reads each KV path once a refresh however many sandboxes name it
// (docs/node.md, "One Vault session").
type vaultSessions struct {
	ctx context.Context // the node's: the sessions run until it ends
	log zerolog.Logger

	mu    sync.Mutex
	byKey map[string]*vault.Session
}

func newVaultSessions(ctx context.Context, log zerolog.Logger) *vaultSessions {
	return &vaultSessions{ctx: ctx, log: log, byKey: map[string]*vault.Session{}}
}

// backend is l's credential backend: for Vault in node mode, a Backend of the
// session its login is shared in (started at its first use); otherwise
// NewBackend's.
func (vs *vaultSessions) backend(l *Loaded, log zerolog.Logger) (credential.Backend, error) {
	c := l.Cfg.Credentials
	if vs == nil || c.Backend != config.BackendVault {
		return NewBackend(l, log)
	}
	o, err := vault.OptionsFromConfig(c.Vault, log)
	if err != nil {
		return nil, err
	}
	cacheFor := readCacheFor(c)
	// The key hashes the login's settings (%#v: the token too, never printed), so a
	// changed login gets a session of its own.
	key := fmt.Sprintf("%x", sha256.Sum256(fmt.Appendf(nil, "%s|%s|%#v|%s", c.Vault.Address, c.Vault.KVMount, c.Vault.Auth, cacheFor)))
	vs.mu.Lock()
	defer vs.mu.Unlock()
	s := vs.byKey[key]
	if s == nil {
		so := o
		so.Log = vs.log
		if s, err = vault.NewSession(so, cacheFor); err != nil {
			return nil, err
		}
		vs.byKey[key] = s
		go s.Run(vs.ctx)
	}
	return s.Backend(o)
}

// readCacheFor is how long a shared KV read is served again: a tenth under the
// stores' refresh interval (the shortest a jittered one can be), so that each
// path is read about once a refresh.
func readCacheFor(c config.Credentials) time.Duration {
	refresh := c.Vault.Refresh
	if refresh <= 0 {
		refresh = credential.DefaultRefresh
	}
	if c.MaxStale > 0 {
		refresh = min(refresh, c.MaxStale/3)
	}
	return time.Duration(float64(refresh) * (1 - credential.DefaultJitter))
}
