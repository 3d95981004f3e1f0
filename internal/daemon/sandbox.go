package daemon

import (
	"errors"
	"slices"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
)

// LoadSandbox validates the spec data of sandbox id against the node's config, as
// check does a sidecar's files: the spec itself (config.ParseSandbox), its
// hooks.json and how its hook calls are told apart, and its credential backend.
// It returns every problem (errors, then warnings) and the Sandbox when none is an
// error. `egressd check --sandbox`, the node API and the sandboxes directory all
// answer with these problems. The Loaded's config is the node's with the spec's
// sections in place.
func LoadSandbox(node *Loaded, id string, data []byte, baseDir string) (*Loaded, []config.Problem) {
	sc, err := config.ParseSandbox(node.Cfg, id, data, baseDir)
	if err != nil {
		return nil, problemsOf(err)
	}
	l := &Loaded{Cfg: sc.Config, Policy: sc.Config.Rules, Sandbox: sc.ID, Netns: sc.Netns, Share: sc.Share}
	var errs []config.Problem
	if _, err := runtimeHooks(l, nil, &liveStore{}); err != nil {
		errs = append(errs, config.Problem{Path: "hooks", Msg: err.Error()})
	}
	if _, err := NewBackend(l, zerolog.Nop()); err != nil {
		errs = append(errs, config.Problem{Path: "credentials", Msg: err.Error()})
	}
	for _, w := range l.Cfg.Warnings {
		if !w.Warning {
			errs = append(errs, w) // hooks.identify's error: check fails on it
		}
	}
	warnings := slices.DeleteFunc(slices.Clone(l.Cfg.Warnings), func(p config.Problem) bool { return !p.Warning })
	if len(errs) > 0 {
		return nil, append(errs, warnings...)
	}
	l.Cfg.Warnings = warnings
	return l, warnings
}

// problemsOf lists the problems of a load error.
func problemsOf(err error) []config.Problem {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		return verr.Problems
	}
	return []config.Problem{{Msg: err.Error()}}
}

// HasError reports whether any of ps is an error.
func HasError(ps []config.Problem) bool {
	return slices.ContainsFunc(ps, func(p config.Problem) bool { return !p.Warning })
}
