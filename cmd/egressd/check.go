package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/netguard"
)

// checkReport is `egressd check --format json`'s output.
type checkReport struct {
	OK       bool             `json:"ok"`
	Problems []config.Problem `json:"problems"`
}

func cmdCheck(args []string) int {
	fs, cfgPath, format := newFlags("check", stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	l, err := load(*cfgPath)
	rep := checkReport{OK: err == nil, Problems: []config.Problem{}}
	var verr *config.ValidationError
	switch {
	case errors.As(err, &verr):
		rep.Problems = verr.Problems
	case err != nil:
		rep.Problems = []config.Problem{{Msg: err.Error()}}
	default:
		for _, err := range preflight(l) {
			rep.OK = false
			rep.Problems = append(rep.Problems, config.Problem{Msg: err.Error()})
		}
		rep.Problems = append(rep.Problems, l.cfg.Warnings...)
		rep.Problems = append(rep.Problems, lintPolicy(l)...)
		creds := lintCredentials(l)
		rep.Problems = append(rep.Problems, creds...)
		lint := lintHooks(l)
		rep.Problems = append(rep.Problems, lint...)
		for _, p := range append(lint, creds...) {
			rep.OK = rep.OK && p.Warning
		}
		// Errors first, as the config loader orders its own problems.
		slices.SortStableFunc(rep.Problems, func(a, b config.Problem) int {
			return cmp.Compare(b2i(a.Warning), b2i(b.Warning))
		})
	}
	if *format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printProblems(rep)
	}
	if !rep.OK {
		return exitUsage
	}
	return exitOK
}

func printProblems(rep checkReport) {
	for _, p := range rep.Problems {
		if p.Warning {
			fmt.Println(p.String()) // String starts warnings with "warning: "
		} else {
			fmt.Printf("error: %s\n", p.String())
		}
	}
	if rep.OK {
		fmt.Println("ok")
	}
}

// lintHooks lints hooks.json (hooks.file, or the policy's inline .agents/hooks.json)
// against the policy; findings are located as hooks.json:<JSON path>.
func lintHooks(l *loaded) []config.Problem {
	data, file := []byte(l.policy.HooksJSON), l.cfg.Policy.File
	if l.cfg.Hooks.File != "" {
		var err error
		if data, err = os.ReadFile(l.cfg.Hooks.File); err != nil {
			return []config.Problem{{Path: "hooks.file", Msg: "cannot read hooks.json: " + err.Error()}}
		}
		file = l.cfg.Hooks.File
	}
	if data == nil {
		return nil
	}
	// A bad CIDR is already a config error; without a guard lint judges by class alone.
	guard, _ := netguard.New(netguard.Options{
		AllowCIDRs:       l.cfg.Network.AllowCIDRs,
		UnsafeAllowCIDRs: l.cfg.Network.UnsafeAllowCIDRs,
	})
	findings := hooks.LintJSON(data, hooks.LintOptions{
		Policy:     l.policy.Allowlist,
		Guard:      guard,
		FailClosed: l.cfg.Hooks.FailClosed,
	})
	return problemsOf(findings, "hooks.json", ":", file)
}

// lintPolicy warns about credentials and auth transforms on "*" or broad wildcards.
func lintPolicy(l *loaded) []config.Problem {
	prefix := "policy.allowlist"
	if l.cfg.Policy.File != "" {
		prefix = allowlistPrefix(l.cfg.Policy.File)
	}
	return problemsOf(hooks.LintPolicy(l.policy.Allowlist.Rules()), prefix, "", l.cfg.Policy.File)
}

// lintCredentials checks every secret of the file backend's credentials file as the
// backend parses it: a bad shape is an error (the fix is in the message), a revoked one a
// warning, a file that cannot be read a warning (run serves nothing from it until it can).
func lintCredentials(l *loaded) []config.Problem {
	c := l.cfg.Credentials
	if c.Backend != config.BackendFile || c.File == "" {
		return nil
	}
	bad, err := file.Check(c.File)
	if err != nil {
		return []config.Problem{{Path: "credentials.file", Msg: err.Error() + "; credentials from it are unavailable until it can be read", Warning: true}}
	}
	ids := slices.Sorted(maps.Keys(bad))
	out := make([]config.Problem, 0, len(ids))
	for _, id := range ids {
		revoked := errors.Is(bad[id], credential.ErrRevoked)
		out = append(out, config.Problem{Path: id, Msg: bad[id].Error(), Warning: revoked, File: c.File})
	}
	return out
}

// allowlistPrefix is the path of the allowlist in the policy file: network.allowlist,
// or allowlist for the {"allowlist": [...]} shape (as the config loader reports it).
func allowlistPrefix(path string) string {
	var top map[string]json.RawMessage
	if data, err := os.ReadFile(path); err == nil && json.Unmarshal(data, &top) == nil {
		if _, ok := top["network"]; !ok {
			return "allowlist"
		}
	}
	return "network.allowlist"
}

// problemsOf turns lint findings into check problems, paths prefixed.
func problemsOf(fs []hooks.Finding, prefix, sep, file string) []config.Problem {
	out := make([]config.Problem, 0, len(fs))
	for _, f := range fs {
		path := prefix
		if f.Path != "" {
			path += sep + f.Path
		}
		out = append(out, config.Problem{Path: path, Msg: f.Msg, Warning: f.Severity == hooks.SeverityWarning, File: file})
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
