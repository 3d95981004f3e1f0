package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/oauth"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
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

// Await waits, at most credential.FirstReadWait, for id's first read and first
// access token while they are in flight after a start (inject.Awaiter).
func (s *liveStore) Await(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, credential.FirstReadWait)
	defer cancel()
	s.p.Load().Await(ctx, id)
}

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

// runtimeHooks is the Snapshot's view of the hooks of config l. When nothing can
// tell the runtime's calls from the sandbox's (identify listener without a hooks
// listener), hook calls are told by their URL on every listener: they are then
// failed closed, where matching nothing would forward them as anyone's request.
// What that costs is a problem on l (identifyProblem).
func runtimeHooks(l *Loaded, signer *hooks.Signer, creds inject.Credentials) (*proxy.Hooks, error) {
	ix, err := LoadHooks(l.Cfg)
	if err != nil || ix == nil {
		return nil, err
	}
	hc := l.Cfg.Hooks
	h := &proxy.Hooks{Index: ix, Signer: signer, FailClosed: hc.FailClosed, Identify: hc.Identify}
	if p, ok := identifyProblem(l.Cfg, ix); ok {
		l.Cfg.Warnings = append(l.Cfg.Warnings, p)
	}
	switch {
	case h.Identify == config.IdentifyListener && !hasHooksListener(l.Cfg):
		h.Identify = config.IdentifyURL
	case h.Identify == config.IdentifyRuntimeAuth:
		h.RuntimeToken = secretToken("hooks.runtime_auth", hc.RuntimeAuth, creds)
	}
	return h, nil
}

func hasHooksListener(cfg *config.Config) bool {
	return slices.ContainsFunc(cfg.Listeners, func(lc config.Listener) bool { return lc.Role == config.RoleHooks })
}

// identifyProblem says what hooks.identify costs: an error (which `check` fails on
// and `run` logs, serving meanwhile) when pre-tool http hooks are failed closed
// and nothing tells the runtime from the sandbox; a warning when url is chosen.
func identifyProblem(cfg *config.Config, ix *hooks.Index) (config.Problem, bool) {
	const cost = "the sandbox can then send what egressd serves as the runtime's hook calls: it can fill the hook lane " +
		"with fake calls, and have egressd sign its own requests to a hook URL (ident url)"
	switch {
	case cfg.Hooks.Identify == config.IdentifyURL:
		return config.Problem{Path: "hooks.identify", Warning: true,
			Msg: "url: any listener's traffic to a hook URL is a hook call; " + cost}, true
	case cfg.Hooks.Identify != config.IdentifyListener || hasHooksListener(cfg) || !cfg.Hooks.FailClosed ||
		!slices.ContainsFunc(ix.Matches(), func(m hooks.Match) bool { return m.Event == hooks.EventPre }):
		return config.Problem{}, false
	}
	return config.Problem{Path: "hooks.identify", Msg: "pre_tool_execution http hooks are failed closed, but nothing " +
		"tells the runtime's calls from the sandbox's: add a listener with role: hooks that only the runtime reaches " +
		"(its HTTPS_PROXY), or set hooks.runtime_auth to a token the runtime presents as Proxy-Authorization; " +
		"hooks.identify: url accepts the risk. Until then hook calls are matched by URL on every listener, and " + cost}, true
}

// secretToken returns the token ref names (hooks.runtime_auth, admin.token; key
// says which in errors): a credential's, read from the store at each call (it may
// rotate), or a file's, read again at most once a second after a failure.
func secretToken(key string, ref config.SecretRef, creds inject.Credentials) func() ([]byte, error) {
	if ref.Credential != "" {
		return func() ([]byte, error) {
			v, err := creds.Get(ref.Credential)
			if err != nil {
				return nil, err
			}
			tok, ok := v.Token()
			if !ok || tok == "" {
				return nil, fmt.Errorf(`%s: credential %s is not {"token": "..."}`, key, ref.Credential)
			}
			return []byte(tok), nil
		}
	}
	f := &tokenFile{key: key, path: ref.File}
	f.read()
	return f.get
}

// tokenFile is a secretToken's file.
type tokenFile struct {
	key   string // the config key naming it
	path  string
	mu    sync.Mutex
	token []byte
	err   error
	at    time.Time
}

func (f *tokenFile) get() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil && time.Since(f.at) >= time.Second {
		f.readLocked()
	}
	return f.token, f.err
}

func (f *tokenFile) read() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readLocked()
}

func (f *tokenFile) readLocked() {
	data, err := os.ReadFile(f.path)
	f.at = time.Now()
	f.token, f.err = bytes.TrimSpace(data), err
	if err == nil && len(f.token) == 0 {
		f.err = fmt.Errorf("%s: %s is empty", f.key, f.path)
	}
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
	return placeholder.New(key, placeholderScope(l), l.Policy.Env, nil, creds), nil
}

// placeholderScope is what placeholders are derived for: the environment, and in
// node mode the sandbox too, so no sandbox holds another's placeholder.
func placeholderScope(l *Loaded) string {
	if l.Sandbox == "" {
		return l.Cfg.Environment
	}
	return l.Cfg.Environment + "/sandbox/" + l.Sandbox
}
