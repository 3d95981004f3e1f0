package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/explain"
	"github.com/egressd/egressd/internal/netguard"
)

func cmdExplain(args []string) int {
	fs, cfgPath, format := newFlags("explain", stderr)
	hook := fs.Bool("hook", false, "explain a POST to URL as a hook call of hooks.json")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: egressd explain [--config FILE] [--format json] [--hook] URL")
		return exitUsage
	}
	if u := fs.Arg(0); !strings.Contains(u, "://") {
		fmt.Fprintf(stderr, "egressd explain: %q has no scheme: give a whole URL, such as https://%s/ or http://%s/\n", u, u, u)
		return exitUsage
	}
	l, err := daemon.Load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	guard, err := netguard.New(netguard.Options{
		AllowCIDRs: l.Cfg.Network.AllowCIDRs, UnsafeAllowCIDRs: l.Cfg.Network.UnsafeAllowCIDRs,
	})
	if err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		return exitUsage
	}
	res := explain.URL(l.Policy.Allowlist, guard, l.Cfg.Environment, fs.Arg(0))
	res = explain.Credential(res, offlineHeaderNames(l))
	res = explain.Placeholders(res, l.Policy.Env, offlineEnvVars(l))
	if *hook {
		ix, err := daemon.LoadHooks(l.Cfg)
		if err != nil {
			fmt.Fprintf(stderr, "egressd: %v\n", err)
			return exitUsage
		}
		if res = explain.Hook(res, fs.Arg(0), ix, l.Cfg.Hooks.FailClosed); res.Hook == nil {
			res.Note = "not a hook URL of an enabled group in hooks.json: treated as ordinary traffic"
		}
	}
	if *format == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(res)
		return exitOK
	}
	printExplain(res)
	return exitOK
}

func printExplain(r explain.Result) {
	fmt.Printf("url:        %s\n", r.URL)
	fmt.Printf("decision:   %s\n", r.Decision)
	if r.Reason != "" {
		fmt.Printf("reason:     %s\n", r.Reason)
	}
	if r.Detail != "" {
		fmt.Printf("detail:     %s\n", r.Detail)
	}
	fmt.Printf("message:    %s\n", r.Message)
	fmt.Printf("rule:       %s\n", orNone(r.Rule))
	fmt.Printf("intercept:  %t\n", r.Intercept)
	fmt.Printf("inject:     %s\n", orNone(strings.Join(r.Inject, ", ")))
	fmt.Printf("credential: %s\n", orNone(r.Credential))
	for _, p := range r.Placeholders {
		fmt.Printf("placeholder: %s (credential %s) replaced in %s\n", orNone(strings.Join(p.Variables, ", ")), p.Credential,
			strings.Join(p.Locations, ", "))
	}
	if r.AWS != nil {
		fmt.Printf("aws:        signed again (SigV4) for regions %s, services %s\n", strings.Join(r.AWS.Regions, " "), strings.Join(r.AWS.Services, " "))
	}
	if r.CredentialUnknown != "" {
		fmt.Printf("credential headers: unknown (%s)\n", r.CredentialUnknown)
	}
	if h := r.Hook; h != nil {
		fmt.Printf("hook:       %s %s (timeout %gs, fail_closed %t)\n", h.Group, h.Event, h.TimeoutSeconds, h.FailClosed)
		fmt.Printf("answer:     %s\n", h.Answer)
	}
	if r.Note != "" {
		fmt.Printf("note:       %s\n", r.Note)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// offlineHeaderNames reads credential header names where explain can without a
// connection: from the credentials file. Vault is not contacted offline.
func offlineHeaderNames(l *daemon.Loaded) explain.HeaderNames {
	if l.Cfg.Credentials.Backend != config.BackendFile {
		return func(string) ([]string, error) {
			return nil, errors.New("credentials.backend " + l.Cfg.Credentials.Backend +
				" is not read offline; GET /v1/explain on a running egressd's admin listener lists them")
		}
	}
	b, err := daemon.NewBackend(l, zerolog.Nop())
	if err != nil {
		return nil
	}
	return explain.FromBackend(context.Background(), b)
}

// offlineEnvVars reads environment_variable credentials where explain can without a
// connection: from the credentials file (nil for Vault, which is not contacted).
func offlineEnvVars(l *daemon.Loaded) explain.EnvVarOf {
	if l.Cfg.Credentials.Backend != config.BackendFile {
		return nil
	}
	b, err := daemon.NewBackend(l, zerolog.Nop())
	if err != nil {
		return nil
	}
	return explain.EnvFromBackend(context.Background(), b)
}
