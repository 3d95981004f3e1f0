package main

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/oauth"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/proxy"
)

// liveStore hands out the daemon's current credentials (the store, behind the oauth2
// token manager): a reload may replace them, and the injectors and the hook signer built
// before it must follow.
type liveStore struct {
	p atomic.Pointer[oauth.Manager]
}

func (s *liveStore) Get(id string) (credential.Value, error) { return s.p.Load().Get(id) }

// loadHooks reads hooks.json (hooks.file, else the policy's inline .agents/hooks.json)
// and indexes its http hooks; nil when there is none. A hooks.json that cannot be
// parsed is an error: egressd cannot fail closed on URLs it cannot read.
func loadHooks(cfg *config.Config) (*hooks.Index, error) {
	data := []byte(cfg.Rules.HooksJSON)
	if cfg.Hooks.File != "" {
		var err error
		if data, err = os.ReadFile(cfg.Hooks.File); err != nil {
			return nil, fmt.Errorf("hooks.file: %w", err)
		}
	}
	if len(data) == 0 {
		return nil, nil
	}
	f, err := hooks.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("hooks.json: %w", err)
	}
	return hooks.NewIndex(f), nil
}

// runtimeHooks is the Runtime's view of the hooks of config l.
func runtimeHooks(l *loaded, signer *hooks.Signer) (*proxy.Hooks, error) {
	ix, err := loadHooks(l.cfg)
	if err != nil || ix == nil {
		return nil, err
	}
	byListener := false
	for _, lc := range l.cfg.Listeners {
		byListener = byListener || lc.Role == config.RoleHooks
	}
	return &proxy.Hooks{Index: ix, Signer: signer, FailClosed: l.cfg.Hooks.FailClosed, ByListener: byListener}, nil
}
