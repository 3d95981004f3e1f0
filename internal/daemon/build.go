package daemon

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/credential/oauth"
	"github.com/egressd/egressd/internal/credential/vault"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
	mitm "github.com/egressd/egressd/internal/tls"
)

// buildSnapshot turns a Loaded config into the Snapshot requests are served with.
// self holds egressd's own bound addresses; the leaves and the credential store
// outlive reloads and are built by the Daemon.
func buildSnapshot(l *Loaded, self []netip.AddrPort, leaves *mitm.Leaves, creds inject.Credentials, signer *hooks.Signer) (*proxy.Snapshot, error) {
	cfg := l.Cfg
	hk, err := runtimeHooks(l, signer, creds)
	if err != nil {
		return nil, err
	}
	guard, err := netguard.New(netguard.Options{
		AllowCIDRs:       cfg.Network.AllowCIDRs,
		UnsafeAllowCIDRs: cfg.Network.UnsafeAllowCIDRs,
		Self:             self,
	})
	if err != nil {
		return nil, err
	}
	upstream, err := mitm.UpstreamConfig(cfg.TLS.UpstreamCAFile)
	if err != nil {
		return nil, err
	}
	snap := &proxy.Snapshot{
		Env:         cfg.Environment,
		Sandbox:     l.Sandbox,
		Policy:      l.Policy.Allowlist,
		Guard:       guard,
		Resolver:    netguard.NewResolver(cfg.Network.Resolver, cfg.Limits.DNS),
		Limits:      cfg.Limits,
		UpstreamTLS: upstream,
		Injector:    inject.New(l.Policy.Allowlist, creds),
		Leaves:      leaves,
		Hooks:       hk,
		// DenyInTunnel: tls.deny_in_tunnel, resolved against tls.intercept.
		DenyInTunnel: cfg.TLS.DenyInside(),
	}
	snap.Prepare()
	if err := pinHookLeaves(leaves, l.Sandbox, hk); err != nil {
		// Not fatal: hooks.json may sit inside the sandbox, and a URL it names must not
		// stop egressd. The leaf is minted again at the first tunnel to that host.
		cfg.Warnings = append(cfg.Warnings, config.Problem{Path: "hooks", Warning: true, Msg: err.Error()})
	}
	return snap, nil
}

// pinHookLeaves pins the interception leaves of the hook hosts of sandbox ("" for
// egressd's own config), minting them now, at start and on every reload that
// builds a Snapshot, so that no flood of other TLS names, from any sandbox, evicts
// them or makes a hook call wait for a mint slot.
func pinHookLeaves(leaves *mitm.Leaves, sandbox string, hk *proxy.Hooks) error {
	if leaves == nil {
		return nil
	}
	var hosts []string
	if hk != nil {
		hosts = hk.Index.Hosts()
	}
	if err := leaves.PinFor(sandbox, hosts); err != nil {
		return fmt.Errorf("minting the hook hosts' leaves (each is tried again at its first tunnel): %w", err)
	}
	return nil
}

// newLeaves loads or creates the interception CA (tls.ca_cert/ca_key, or state_dir).
func newLeaves(cfg *config.Config, m *metrics.Metrics) (*mitm.Leaves, error) {
	ca, _, err := mitm.LoadOrCreateCA(cfg.TLS.CACert, cfg.TLS.CAKey, cfg.StateDir, cfg.Environment)
	if err != nil {
		return nil, err
	}
	return mitm.NewLeaves(ca, mitm.LeafOptions{
		MintConcurrency: cfg.Limits.LeafMints,
		OnLookup: func(hit bool) {
			result := "miss"
			if hit {
				result = "hit"
			}
			m.LeafCache.WithLabelValues(result).Inc()
		},
	}), nil
}

// credentialIDs lists the credential IDs the policy (and the hook signing key, the
// runtime token and the admin token) references, sorted.
func credentialIDs(l *Loaded) []string {
	var ids []string
	for _, id := range []string{l.Cfg.Hooks.SigningKey.Credential, l.Cfg.Hooks.RuntimeAuth.Credential, l.Cfg.Admin.Token.Credential} {
		if id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, r := range l.Policy.Allowlist.Rules() {
		if r.Credential != "" && !slices.Contains(ids, r.Credential) {
			ids = append(ids, r.Credential)
		}
	}
	for _, id := range l.Policy.Env {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// storeKey identifies what a credential store was built from: a reload keeps the
// running store (and its last good values) unless this changes.
func storeKey(l *Loaded) string {
	c := l.Cfg.Credentials
	// The Vault section is hashed as %#v of its fields, not through VaultAuth's
	// redacting String, so a changed token rebuilds the store too; the hash never
	// leaves this process.
	vault := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%s|%s|%v|%#v|%s|%s|%s|%s|%s|%s|%s|%s",
		c.Vault.Address, c.Vault.KVMount, c.Vault.KVPrefix, c.Vault.Refresh, c.Vault.Paths,
		c.Vault.Auth.Method, c.Vault.Auth.Token, c.Vault.Auth.TokenFile, c.Vault.Auth.RoleIDFile,
		c.Vault.Auth.SecretIDFile, c.Vault.Auth.Role, c.Vault.Auth.JWTFile, c.Vault.Auth.Mount, c.File))
	return fmt.Sprintf("%s|%s|%s|%x|%s", c.Backend, c.File, c.MaxStale, vault[:8], strings.Join(credentialIDs(l), ","))
}

// newStore builds and starts the credential store for the policy's credential IDs (its
// first reads in the background: egressd serves meanwhile, and a request that needs a
// credential still being read waits for it, credential.FirstReadWait), and the oauth2
// token manager over it (not started: it needs the Snapshot's guard for its token calls).
// A Vault that cannot be reached, or refuses the login, is not fatal: its credentials are
// unavailable (never_read, credential_ready 0) while the backend keeps retrying.
func newStore(ctx context.Context, l *Loaded, sh shared) (*credential.Store, *oauth.Manager, error) {
	c, log, m := l.Cfg.Credentials, sh.log, sh.m
	backend, err := sh.vaults.backend(l, log)
	if err != nil {
		return nil, nil, err
	}
	opts := credential.Options{MaxStale: c.MaxStale, Log: log}
	if vb, ok := backend.(*vault.Backend); ok {
		log.Info().Str("address", vb.Address()).Str("auth", c.Vault.Auth.Method).Str("kv_mount", c.Vault.KVMount).
			Str("kv_prefix", c.Vault.KVPrefix).Msg("credentials from vault")
		opts.Refresh = c.Vault.Refresh
		vb.SetMintMetrics(func(id, result string) { m.CredentialMint.WithLabelValues(id, result).Inc() })
	}
	ids := credentialIDs(l)
	for _, id := range ids {
		for _, r := range []string{credential.ResultOK, credential.ResultError, credential.ResultNotFound, credential.ResultInvalid, credential.ResultRevoked} {
			m.CredentialRefresh.WithLabelValues(id, r)
		}
		m.CredentialAge.WithLabelValues(id)
	}
	opts.Metrics = &credential.Metrics{
		Refresh: func(id, result string) { m.CredentialRefresh.WithLabelValues(id, result).Inc() },
		Age:     func(id string, s float64) { m.CredentialAge.WithLabelValues(id).Set(s) },
	}
	store := credential.NewStore(backend, ids, opts)
	store.StartAsync(ctx)
	go func() {
		select {
		case <-store.FirstRead():
		case <-ctx.Done():
			return
		}
		for _, id := range ids {
			v, err := store.Get(id)
			if err == nil && v.OAuth2 != nil {
				m.OAuthRefresh.WithLabelValues(id, oauth.ResultOK)
				m.OAuthRefresh.WithLabelValues(id, oauth.ResultError)
			}
			if err == nil && v.GitHubApp != nil {
				m.CredentialMint.WithLabelValues(id, oauth.ResultOK)
				m.CredentialMint.WithLabelValues(id, oauth.ResultError)
			}
		}
	}()
	oo := oauth.Options{Log: log, Metrics: func(id, result string) { m.OAuthRefresh.WithLabelValues(id, result).Inc() },
		Mint: func(id, result string) { m.CredentialMint.WithLabelValues(id, result).Inc() }}
	oo.Writer, _ = backend.(credential.Writer)
	return store, oauth.New(store, oo), nil
}

// tokenClient is the HTTP client of oauth2 token calls: egressd's own, through snap's
// address guard and upstream TLS roots, never the sandbox's allowlist.
func tokenClient(l *Loaded, snap *proxy.Snapshot) *http.Client {
	return oauth.NewClient(snap.Guard, snap.Resolver, snap.UpstreamTLS, l.Cfg.Limits.Dial)
}

// NewBackend builds the credential backend of l without reading from it.
func NewBackend(l *Loaded, log zerolog.Logger) (credential.Backend, error) {
	c := l.Cfg.Credentials
	switch c.Backend {
	case config.BackendFile:
		return file.New(c.File, file.Options{Log: log}), nil
	case config.BackendVault:
		return vault.FromConfig(c.Vault, log)
	}
	return nil, fmt.Errorf("credentials.backend %q is not available in this build", c.Backend)
}

// preflight builds from l everything run builds before it serves, with the same
// functions, and returns every error that would stop run from starting: the CA
// (tls.ca_cert, tls.ca_key, or the state dir's), the hook signing key, the
// credential backend, and the Snapshot (hooks.json, the address guard,
// tls.upstream_ca_file). It writes, listens on and contacts nothing: a CA or a
// signing key that run would generate in the state dir is left to run, and so
// are the listen addresses (bound only by run). check reports these errors.
func Preflight(l *Loaded) []error {
	var errs []error
	if _, err := mitm.LoadExistingCA(l.Cfg.TLS.CACert, l.Cfg.TLS.CAKey, l.Cfg.StateDir); err != nil {
		errs = append(errs, err)
	}
	creds := &liveStore{} // never read: nothing is served
	if err := hooks.CheckSignerConfig(l.Cfg.Hooks.SigningKey, l.Cfg.StateDir, creds); err != nil {
		errs = append(errs, err)
	}
	if _, err := NewBackend(l, zerolog.Nop()); err != nil {
		errs = append(errs, err)
	}
	snap, err := buildSnapshot(l, nil, nil, creds, nil)
	if err != nil {
		return append(errs, err)
	}
	snap.Close()
	return errs
}
