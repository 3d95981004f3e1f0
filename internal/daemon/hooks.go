package daemon

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/oauth"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy"
)

// liveStore hands out the Daemon's current credentials (the store, behind the oauth2
// token manager): a reload may replace them, and the injectors and the hook signer built
// before it must follow.
type liveStore struct {
	p atomic.Pointer[oauth.Manager]
}

func (s *liveStore) Get(id string) (credential.Value, error) { return s.p.Load().Get(id) }

// loadHooks reads hooks.json (hooks.file, else the policy's inline .agents/hooks.json)
// and indexes its http hooks; nil when there is none. A hooks.json that cannot be
// parsed is an error: egressd cannot fail closed on URLs it cannot read.
func LoadHooks(cfg *config.Config) (*hooks.Index, error) {
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
func runtimeHooks(l *Loaded, signer *hooks.Signer) (*proxy.Hooks, error) {
	ix, err := LoadHooks(l.Cfg)
	if err != nil || ix == nil {
		return nil, err
	}
	byListener := false
	for _, lc := range l.Cfg.Listeners {
		byListener = byListener || lc.Role == config.RoleHooks
	}
	return &proxy.Hooks{Index: ix, Signer: signer, FailClosed: l.Cfg.Hooks.FailClosed, ByListener: byListener}, nil
}

// placeholders builds the policy's placeholder replacer (nil when its env section names no
// credential), loading or creating the derivation key in state_dir.
func Placeholders(l *Loaded, creds placeholder.Credentials) (*placeholder.Replacer, error) {
	if len(l.Policy.Env) == 0 {
		return nil, nil
	}
	key, err := placeholder.LoadKey(l.Cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return placeholder.New(key, l.Cfg.Environment, l.Policy.Env, nil, creds), nil
}
