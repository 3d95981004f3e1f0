// Package vault reads credentials from HashiCorp Vault (KV v2 and any leased path), behind
// credential.Backend.
//
// A credential ID "x" is read from KV v2 at <kv_mount>/data/<kv_prefix>/x, whose data is one
// of credential.Parse's shapes (typed ones included; the ID is the path's last segment); the KV version is the credential's version. An ID
// listed in Options.Paths is read from that Vault path instead (a Vault identity token, a
// dynamic secret), one string field of its data becoming one header.
//
// The client is Vault's own (github.com/hashicorp/vault/api, api.DefaultConfig), so
// VAULT_ADDR, VAULT_CACERT, VAULT_CAPATH, VAULT_CLIENT_CERT, VAULT_CLIENT_TIMEOUT,
// VAULT_MAX_RETRIES, VAULT_NAMESPACE, VAULT_SKIP_VERIFY and VAULT_TOKEN (token auth) are
// honoured as by every Vault client; Options.Address wins over VAULT_ADDR. Like every
// Vault client it also honours HTTP_PROXY, HTTPS_PROXY and NO_PROXY (and VAULT_HTTP_PROXY):
// do not point them at egressd itself.
//
// egressd logs in with an AuthMethod (token, AppRole, JWT, Kubernetes), renews its token
// with api.LifetimeWatcher and logs in again, with backoff, when the token can no longer
// be renewed or Vault rejects it. A login failure is a failed read, never fatal: the Store
// reports the credentials as never read (or stale) and keeps retrying.
//
// Invariant: no error, log line or version holds a secret value. Errors carry Vault's
// status and its own error strings, a path, a credential ID or a field name; values egressd
// sent (token, secret ID, JWT) are scrubbed from them should Vault ever echo one.
package vault

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
)

// Options configure a Backend.
type Options struct {
	// Address of Vault; "" means VAULT_ADDR (or Vault's default, https://127.0.0.1:8200).
	Address string
	// Auth logs egressd in. Required.
	Auth AuthMethod
	// KVMount and KVPrefix place credential "x" at <KVMount>/data/<KVPrefix>/x; defaults
	// config.DefaultVaultKVMount ("secret") and config.DefaultVaultKVPrefix.
	KVMount, KVPrefix string
	// Paths are credentials read from other Vault paths, by credential ID.
	Paths map[string]Path
	// LoginBackoff is the wait after a failed login, doubling up to MaxLoginBackoff;
	// defaults DefaultLoginBackoff (1s) and DefaultMaxLoginBackoff (1m).
	LoginBackoff, MaxLoginBackoff time.Duration
	// Log receives login, renewal and lease lines, never values; the zero Logger discards.
	Log zerolog.Logger
}

// Backend reads credentials from Vault. It is a credential.Backend and a
// credential.IDWatcher: Store.Start runs its WatchIDs, which keeps the Vault token alive
// and re-reads a leased or short-lived credential before it expires. Without WatchIDs
// running, Read still logs in whenever there is no usable token, but nothing renews it.
type Backend struct {
	client            *api.Client
	sess              *session
	kvMount, kvPrefix string
	paths             map[string]Path
	leases            *leases
	log               zerolog.Logger
	mint              func(id, result string) // aws.go: SetMintMetrics
	shared            *Session                // the login and KV reads this Backend shares; nil: its own
}

var (
	_ credential.Backend   = (*Backend)(nil)
	_ credential.IDWatcher = (*Backend)(nil)
)

// New returns a Backend. It does not contact Vault: the first Read logs in.
func New(o Options) (*Backend, error) {
	if o.Auth == nil {
		return nil, errors.New("vault: no auth method")
	}
	cfg := api.DefaultConfig() // reads the VAULT_* environment
	if cfg.Error != nil {
		return nil, fmt.Errorf("vault: client config from the environment: %w", cfg.Error)
	}
	if o.Address != "" {
		cfg.Address = o.Address
	}
	if os.Getenv(api.EnvVaultMaxRetries) == "" {
		// The store re-reads every refresh anyway: the client's own retries (by
		// default two, with backoff, 3 to 4.5 s in all) would only hold a refresh
		// and delay both the failure being seen and the recovery.
		cfg.MaxRetries = 0
	}
	refuseRedirects(cfg)
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	client.ClearToken() // NewClient took VAULT_TOKEN: only the AuthMethod gives the token
	paths, err := withDefaults(o.Paths)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		client: client,
		sess:   newSession(client, o.Auth, o.Log, positive(o.LoginBackoff, DefaultLoginBackoff), positive(o.MaxLoginBackoff, DefaultMaxLoginBackoff)),
		paths:  paths,
		leases: newLeases(newLeaseKey()),
		log:    o.Log,
	}
	b.kvMount, b.kvPrefix = kvPlace(o.KVMount, o.KVPrefix)
	return b, nil
}

// withDefaults is paths with each Path's defaults filled in.
func withDefaults(paths map[string]Path) (map[string]Path, error) {
	out := make(map[string]Path, len(paths))
	for id, p := range paths {
		var err error
		if out[id], err = p.withDefaults(id); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// kvPlace is the KV mount and prefix, defaults filled in.
func kvPlace(mount, prefix string) (string, string) {
	return strings.Trim(or(mount, config.DefaultVaultKVMount), "/"), strings.Trim(or(prefix, config.DefaultVaultKVPrefix), "/")
}

// newLeaseKey is a random key for the HMAC versions of unleased values (leases).
func newLeaseKey() [32]byte {
	var key [32]byte
	rand.Read(key[:])
	return key
}

// FromConfig returns the Backend credentials.vault describes.
func FromConfig(c config.Vault, log zerolog.Logger) (*Backend, error) {
	o, err := OptionsFromConfig(c, log)
	if err != nil {
		return nil, err
	}
	return New(o)
}

// OptionsFromConfig is the Options credentials.vault describes.
func OptionsFromConfig(c config.Vault, log zerolog.Logger) (Options, error) {
	auth, err := AuthFromConfig(c.Auth)
	if err != nil {
		return Options{}, err
	}
	paths := make(map[string]Path, len(c.Paths))
	for _, p := range c.Paths {
		paths[p.ID] = Path{Path: p.Path, Field: p.Field, Header: p.Header, Format: p.Format}
	}
	return Options{Address: c.Address, Auth: auth, KVMount: c.KVMount, KVPrefix: c.KVPrefix, Paths: paths, Log: log}, nil
}

// Name is "vault".
func (b *Backend) Name() string { return config.BackendVault }

// Address is the Vault address the client uses.
func (b *Backend) Address() string { return b.client.Address() }

// Read returns the headers and version of id: from KV, or from its Path. It logs in first
// when there is no token. When Vault refuses the read and then refuses the token itself
// (revoked, expired), it logs in again and reads once more.
func (b *Backend) Read(ctx context.Context, id string) (credential.Secret, string, error) {
	for retried := false; ; retried = true {
		l, err := b.sess.token(ctx)
		if err != nil {
			return credential.Secret{}, "", err
		}
		sec, version, err := b.read(ctx, id)
		if !retried && isForbidden(err) && b.sess.checkRejected(ctx, l) {
			continue
		}
		return sec, version, err
	}
}

func (b *Backend) read(ctx context.Context, id string) (credential.Secret, string, error) {
	if p, ok := b.paths[id]; ok {
		headers, version, err := b.readPath(ctx, id, p)
		return credential.Secret{Headers: headers}, version, err
	}
	sec, version, err := b.readKV(ctx, id)
	if err == nil && sec.AWS != nil && sec.AWS.Vault != nil {
		return b.readAWS(ctx, id, sec, version)
	}
	return sec, version, err
}

// WatchIDs runs until ctx ends: it keeps the Vault token (login, renewal, login again) and
// calls refresh(id) when a leased or short-lived credential nears its end, refresh("")
// after a login that followed failed reads.
func (b *Backend) WatchIDs(ctx context.Context, refresh func(id string)) {
	var wg sync.WaitGroup
	if b.shared != nil {
		wg.Go(func() { b.shared.watch(ctx, b, refresh) }) // the Session keeps the token
	} else {
		wg.Go(func() { b.sess.run(ctx, func() { refresh("") }) })
	}
	b.leases.run(ctx, refresh)
	wg.Wait()
	b.revokeAll()
}

func positive(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
