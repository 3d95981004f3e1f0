package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/netguard"
)

// checkReport is `egressd check --format json`'s output.
type checkReport struct {
	OK       bool             `json:"ok"`
	Problems []config.Problem `json:"problems"`
}

func cmdCheck(args []string) int {
	fs, cfgPath, format := newFlags("check", stderr)
	strict := fs.Bool("strict", false, "fail on warnings too (for CI pipelines)")
	sandbox := fs.String("sandbox", "", "a node's sandbox spec `FILE` (<id>.json or .yaml) to validate against --config")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *sandbox != "" {
		return checkSandbox(*cfgPath, *sandbox, *format, *strict)
	}
	l, err := daemon.Load(*cfgPath)
	rep := checkReport{OK: err == nil, Problems: []config.Problem{}}
	var verr *config.ValidationError
	switch {
	case errors.As(err, &verr):
		rep.Problems = verr.Problems
	case err != nil:
		rep.Problems = []config.Problem{{Msg: err.Error()}}
	default:
		for _, err := range daemon.Preflight(l) {
			rep.OK = false
			rep.Problems = append(rep.Problems, config.Problem{Msg: err.Error()})
		}
		// l.Cfg.Warnings may hold errors that do not stop `run` (hooks.identify).
		rep.Problems = append(rep.Problems, l.Cfg.Warnings...)
		rep.Problems = append(rep.Problems, lintPolicy(l)...)
		rep.Problems = append(rep.Problems, lintMemory(l.Cfg)...)
		creds := slices.Concat(lintCredentials(l), lintAWS(l), lintVaultAuth(l.Cfg))
		rep.Problems = append(rep.Problems, creds...)
		rep.Problems = append(rep.Problems, lintSplicedReflection(l)...)
		lint := append(lintHooks(l), lintAdminToken(l)...)
		rep.Problems = append(rep.Problems, lint...)
		for _, p := range slices.Concat(lint, creds, l.Cfg.Warnings) {
			rep.OK = rep.OK && p.Warning
		}
		// Errors first, as the config loader orders its own problems.
		slices.SortStableFunc(rep.Problems, func(a, b config.Problem) int {
			return cmp.Compare(b2i(a.Warning), b2i(b.Warning))
		})
	}
	if *strict && hasWarning(rep.Problems) {
		rep.OK = false // --strict: a warning fails the check like an error
	}
	return report(rep, *format)
}

// report prints rep in format and returns check's exit code.
func report(rep checkReport, format string) int {
	if format == "json" {
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

// checkSandbox validates a sandbox spec file against the node config at cfgPath,
// with the problems the node API answers for the same spec (daemon.LoadSandbox).
// The sandbox's ID is the file's name without its extension.
func checkSandbox(cfgPath, file, format string, strict bool) int {
	l, err := daemon.Load(cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "egressd: %v\n", err)
		return exitUsage
	}
	id := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	_, problems := daemon.LoadSandbox(l, id, data, filepath.Dir(file))
	rep := checkReport{OK: !daemon.HasError(problems) && !(strict && hasWarning(problems)), Problems: problems}
	if rep.Problems == nil {
		rep.Problems = []config.Problem{}
	}
	return report(rep, format)
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
func lintHooks(l *daemon.Loaded) []config.Problem {
	data, file := []byte(l.Policy.HooksJSON), l.Cfg.Policy.File
	if l.Cfg.Hooks.File != "" {
		var err error
		if data, err = os.ReadFile(l.Cfg.Hooks.File); err != nil {
			return []config.Problem{{Path: "hooks.file", Msg: "cannot read hooks.json: " + err.Error()}}
		}
		file = l.Cfg.Hooks.File
	}
	if data == nil {
		return nil
	}
	// A bad CIDR is already a config error; without a guard lint judges by class alone.
	guard, _ := netguard.New(netguard.Options{
		AllowCIDRs:       l.Cfg.Network.AllowCIDRs,
		UnsafeAllowCIDRs: l.Cfg.Network.UnsafeAllowCIDRs,
	})
	findings := hooks.LintJSON(data, hooks.LintOptions{
		Policy:     l.Policy.Allowlist,
		Guard:      guard,
		FailClosed: l.Cfg.Hooks.FailClosed,
	})
	return problemsOf(findings, "hooks.json", ":", file)
}

// lintMemory warns when the limits cannot fit the memory limit check can see (the
// cgroup's, else GOMEMLIMIT): the budget (which every connection draws on) and
// egressd's own footprint, the connections every listener may hold beyond its
// bound beside them, a hook buffer the budget caps.
// Where egressd runs elsewhere, check sees that machine's limit, not this one's.
func lintMemory(cfg *config.Config) []config.Problem {
	limit, from := membudget.MemoryLimit()
	if from == "" {
		return nil
	}
	budget, _ := membudget.Resolve(cfg.Limits.Memory)
	d := membudget.Demand{Budget: budget, Listeners: len(cfg.Listeners),
		HookBuffer: cfg.Limits.HookBufferBytes, HookBodyMax: cfg.Limits.HookBodyBytes}
	var out []config.Problem
	for _, s := range d.Shortfalls(limit, from) {
		out = append(out, config.Problem{Path: s.Key, Msg: s.Msg, Warning: true})
	}
	return out
}

// lintPolicy warns about credentials and auth transforms on "*" or broad wildcards.
func lintPolicy(l *daemon.Loaded) []config.Problem {
	prefix := "policy.allowlist"
	if l.Cfg.Policy.File != "" {
		prefix = allowlistPrefix(l.Cfg.Policy.File)
	}
	return problemsOf(hooks.LintPolicy(l.Policy.Allowlist.Rules()), prefix, "", l.Cfg.Policy.File)
}

// lintCredentials checks the file backend's credentials file as `run` will read it:
// every secret's shape (a bad one is an error with the fix, a revoked one a warning),
// every credential ID the policy names (one the file lacks is an error: its requests
// would get 503), and its mode (readable by every user: a warning, as `run` gives). A
// file that cannot be read is a warning (it may be mounted only where egressd runs); one
// that does not parse is an error with its line and column.
func lintCredentials(l *daemon.Loaded) []config.Problem {
	c := l.Cfg.Credentials
	if c.Backend != config.BackendFile || c.File == "" {
		return nil
	}
	in, err := file.Inspect(c.File)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
		return []config.Problem{{Path: "credentials.file", Msg: err.Error() + "; credentials from it are unavailable until it can be read", Warning: true}}
	case err != nil:
		return []config.Problem{{Path: "credentials.file", Msg: err.Error(), File: c.File}}
	}
	var out []config.Problem
	for _, id := range slices.Sorted(maps.Keys(in.Bad)) {
		revoked := errors.Is(in.Bad[id], credential.ErrRevoked)
		out = append(out, config.Problem{Path: id, Msg: in.Bad[id].Error(), Warning: revoked, File: c.File})
	}
	for _, ref := range credentialRefs(l) {
		if !slices.Contains(in.IDs, ref.id) {
			out = append(out, config.Problem{Path: ref.path, File: ref.file, Msg: fmt.Sprintf(
				"credential %q is not in %s: requests that need it would get 503 credential_unavailable; "+
					`add {"%s": {"token": "..."}} to that file, or fix the ID`, ref.id, c.File, ref.id)})
		}
	}
	if in.WorldReadable {
		out = append(out, config.Problem{Path: "credentials.file", Warning: true, Msg: fmt.Sprintf(
			"%s is readable by every user; chmod o-r it (or set defaultMode 0440 on the volume)", c.File)})
	}
	return out
}

// lintVaultAuth checks the files a Vault login reads (token_file, role_id_file and
// secret_id_file, jwt_file) as `run` reads them at every login: one that is missing,
// unreadable by this user or empty is a warning, not an error, as for the
// credentials file: it may exist only where egressd runs (a projected token in a pod).
func lintVaultAuth(cfg *config.Config) []config.Problem {
	if cfg.Credentials.Backend != config.BackendVault {
		return nil
	}
	a := cfg.Credentials.Vault.Auth
	files := map[string]string{}
	switch a.Method {
	case config.AuthAppRole:
		files["role_id_file"], files["secret_id_file"] = a.RoleIDFile, a.SecretIDFile
	case config.AuthJWT, config.AuthKubernetes:
		files["jwt_file"] = a.JWTFile
	default:
		files["token_file"] = a.TokenFile
	}
	var out []config.Problem
	for _, key := range slices.Sorted(maps.Keys(files)) {
		if err := readableNonEmpty(files[key]); err != nil {
			out = append(out, config.Problem{Path: "credentials.vault.auth." + key, Warning: true,
				Msg: err.Error() + "; every Vault login fails until egressd can read it, and with it every Vault credential"})
		}
	}
	return out
}

// readableNonEmpty: path ("" is not set: nothing to read) opens and holds something.
func readableNonEmpty(path string) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return fmt.Errorf("%s is empty", path)
	}
	return nil
}

// lintSplicedReflection warns about each environment_variable credential placed in
// request bodies or queries while some entry is spliced: responses are scrubbed of
// its value only where egressd terminates TLS, and a value placed in a body or a query
// is the kind an upstream stores and serves back, through any host. tls.intercept: all
// closes that. The locations are read from the credentials file, as run reads it;
// another backend is not contacted offline.
func lintSplicedReflection(l *daemon.Loaded) []config.Problem {
	if l.Cfg.TLS.Intercept == allowlist.InterceptAll || len(l.Policy.Env) == 0 || l.Cfg.Credentials.Backend != config.BackendFile {
		return nil
	}
	b, err := daemon.NewBackend(l, zerolog.Nop())
	if err != nil {
		return nil
	}
	var envs []*credential.EnvVar
	var ids []string
	for _, id := range slices.Sorted(maps.Values(l.Policy.Env)) {
		sec, _, err := b.Read(context.Background(), id)
		if err != nil || sec.Env == nil || slices.Contains(ids, id) {
			continue // a bad or missing secret is lintCredentials' to report
		}
		envs = append(envs, sec.Env)
		if sec.Env.In(credential.LocationBody) || sec.Env.In(credential.LocationQuery) {
			ids = append(ids, id)
		}
	}
	spliced := splicedEntries(l, envs)
	if len(ids) == 0 || len(spliced) == 0 {
		return nil
	}
	var out []config.Problem
	for _, id := range ids {
		out = append(out, config.Problem{Path: id, File: l.Cfg.Credentials.File, Warning: true, Msg: fmt.Sprintf(
			"environment_variable credential %s is placed in request bodies or queries: an upstream that stores it can "+
				"serve it back through an entry egressd splices (%s), whose responses it cannot scrub; set tls.intercept: all "+
				"to scrub every response", id, strings.Join(spliced, ", "))})
	}
	return out
}

// splicedEntries returns the patterns of the entries whose tunnels egressd splices
// (at most three, then "..."): under tls.intercept auto those that inject nothing and
// are not trusted domains of an environment_variable credential; under none all but
// the trusted domains.
func splicedEntries(l *daemon.Loaded, envs []*credential.EnvVar) []string {
	var out []string
	for _, r := range l.Policy.Allowlist.Rules() {
		trusted := slices.ContainsFunc(envs, func(e *credential.EnvVar) bool { return e.Trusts(r.Pattern) })
		if trusted || r.Injects() && l.Cfg.TLS.Intercept != allowlist.InterceptNone {
			continue
		}
		if len(out) == 3 {
			return append(out, "...")
		}
		out = append(out, r.Pattern)
	}
	return out
}

// credentialRef is where the config or policy names a credential ID.
type credentialRef struct{ id, path, file string }

// credentialRefs lists the credential IDs the policy (and the hook signing key and
// runtime token) names, each with the path that names it.
func credentialRefs(l *daemon.Loaded) []credentialRef {
	var refs []credentialRef
	if id := l.Cfg.Hooks.SigningKey.Credential; id != "" {
		refs = append(refs, credentialRef{id, "hooks.signing_key.credential", ""})
	}
	if id := l.Cfg.Hooks.RuntimeAuth.Credential; id != "" {
		refs = append(refs, credentialRef{id, "hooks.runtime_auth.credential", ""})
	}
	prefix := "policy.allowlist"
	if l.Cfg.Policy.File != "" {
		prefix = allowlistPrefix(l.Cfg.Policy.File)
	}
	for _, r := range l.Policy.Allowlist.Rules() {
		if r.Credential != "" {
			refs = append(refs, credentialRef{r.Credential, fmt.Sprintf("%s[%d].credential", prefix, r.Index), l.Cfg.Policy.File})
		}
	}
	return refs
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

func hasWarning(ps []config.Problem) bool {
	return slices.ContainsFunc(ps, func(p config.Problem) bool { return p.Warning })
}
