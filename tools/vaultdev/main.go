// Command vaultdev runs a real HashiCorp Vault server for egressd's tests: an
// in-memory, initialised and unsealed Vault core (Vault v1.20.4 packages) on a
// 127.0.0.1 listener, with KV v2 at secret/ and the approle and jwt auth
// methods enabled through the HTTP API, as an operator would. The AWS secrets
// engine is registered (not mounted): a test mounts it (type "aws") and points
// its config/root at a local STS endpoint.
//
// When ready it prints one JSON line to stdout:
//
//	{"addr":"http://127.0.0.1:PORT","root_token":"hvs....","unseal_key":"..."}
//
// and writes the same line to -ready-file when given (removed again on exit).
// It shuts Vault down and exits 0 on SIGINT or SIGTERM. Everything is lost on
// exit; restart with the same -addr and -root-token to get the same address
// and root token back. Identity tokens (identity/oidc/token/<role>) need no
// extra setup: the identity store is part of the core and its issuer is the
// listener's address.
//
// Build it with scripts/vaultdev.sh (it vendors and patches the sdk first);
// this module is separate from egressd's so Vault never enters its go.mod.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	credJWT "github.com/hashicorp/vault-plugin-auth-jwt"
	logicalKv "github.com/hashicorp/vault-plugin-secrets-kv"
	"github.com/hashicorp/vault/api"
	credAppRole "github.com/hashicorp/vault/builtin/credential/approle"
	logicalAws "github.com/hashicorp/vault/builtin/logical/aws"
	vaulthttp "github.com/hashicorp/vault/http"
	"github.com/hashicorp/vault/internalshared/configutil"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/logical"
	"github.com/hashicorp/vault/sdk/physical/inmem"
	"github.com/hashicorp/vault/vault"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (host must be a loopback IP; port 0 picks a free port)")
	readyFile := flag.String("ready-file", "", "also write the ready JSON line to this file (atomically)")
	logLevel := flag.String("log-level", "warn", "Vault log level on stderr: trace, debug, info, warn, error, off")
	rootToken := flag.String("root-token", "", "use this ID for the root token (like vault -dev-root-token-id), so a restarted server keeps it; default: generated")
	flag.Parse()

	// The server is hermetic: VAULT_* settings meant for clients (VAULT_ADDR,
	// VAULT_TOKEN, VAULT_CACERT, VAULT_NAMESPACE...) must not steer it or the
	// client it uses to configure itself.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "VAULT_") {
			os.Unsetenv(k)
		}
	}

	if err := run(*addr, *readyFile, *logLevel, *rootToken); err != nil {
		fmt.Fprintf(os.Stderr, "vaultdev: %v\n", err)
		os.Exit(1)
	}
}

// ready is the line printed (and written to -ready-file) once Vault serves.
type ready struct {
	Addr      string `json:"addr"`
	RootToken string `json:"root_token"`
	// UnsealKey is the only key share: a test can seal Vault (PUT
	// sys/seal, every request then fails with 503) and unseal it again
	// (PUT sys/unseal {"key": ...}) with its data and tokens intact.
	UnsealKey string `json:"unseal_key"`
}

func run(addr, readyFile, logLevel, wantRoot string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: host must be a loopback IP such as 127.0.0.1", addr)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	logger := hclog.New(&hclog.LoggerOptions{
		Name:   "vaultdev",
		Level:  hclog.LevelFromString(logLevel),
		Output: os.Stderr,
	})
	if logLevel == "off" {
		logger = hclog.NewNullLogger()
	}

	// Listen first so the core knows its own address (api_addr): the identity
	// store uses it as the issuer of identity/oidc tokens.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	baseURL := "http://" + ln.Addr().String()

	phys, err := inmem.NewInmem(nil, logger.Named("storage"))
	if err != nil {
		return fmt.Errorf("inmem storage: %w", err)
	}
	core, err := vault.NewCore(&vault.CoreConfig{
		Physical:           phys,
		Logger:             logger.Named("core"),
		DisableMlock:       true,
		RedirectAddr:       baseURL,
		LogicalBackends:    map[string]logical.Factory{"kv": logicalKv.Factory, "aws": logicalAws.Factory},
		CredentialBackends: map[string]logical.Factory{"approle": credAppRole.Factory, "jwt": credJWT.Factory},
		BuiltinRegistry:    registry{},
	})
	if err != nil {
		return fmt.Errorf("vault.NewCore: %w", err)
	}
	defer core.Shutdown()

	initRes, err := core.Initialize(ctx, &vault.InitParams{
		BarrierConfig: &vault.SealConfig{SecretShares: 1, SecretThreshold: 1},
	})
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	unsealed, err := core.Unseal(initRes.SecretShares[0])
	if err != nil {
		return fmt.Errorf("unseal: %w", err)
	}
	if !unsealed {
		return errors.New("unseal: still sealed after the only key share")
	}

	srv := &http.Server{
		Handler: vaulthttp.Handler.Handler(&vault.HandlerProperties{
			Core:           core,
			ListenerConfig: &configutil.Listener{Address: ln.Addr().String()},
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          logger.Named("http").StandardLogger(nil),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	root, err := configure(ctx, baseURL, initRes.RootToken, wantRoot)
	if err != nil {
		return err
	}

	line, err := json.Marshal(ready{
		Addr:      baseURL,
		RootToken: root,
		UnsealKey: base64.StdEncoding.EncodeToString(initRes.SecretShares[0]),
	})
	if err != nil {
		return err
	}
	if readyFile != "" {
		if err := writeAtomic(readyFile, append(line, '\n')); err != nil {
			return fmt.Errorf("-ready-file: %w", err)
		}
		defer os.Remove(readyFile)
	}
	fmt.Printf("%s\n", line)

	select {
	case <-ctx.Done():
		logger.Info("signal received; shutting down")
		return nil
	case err := <-serveErr:
		return fmt.Errorf("http server: %w", err)
	}
}

// configure does, through the HTTP API, what an operator does on a fresh
// Vault: KV v2 at secret/, and the approle and jwt auth methods. With
// wantRoot it swaps the generated root token for one with that ID (as vault
// server -dev-root-token-id does). It returns the root token to hand out.
func configure(ctx context.Context, baseURL, rootToken, wantRoot string) (string, error) {
	cfg := api.DefaultConfig()
	if cfg.Error != nil {
		return "", fmt.Errorf("api client config: %w", cfg.Error)
	}
	cfg.Address = baseURL
	c, err := api.NewClient(cfg)
	if err != nil {
		return "", fmt.Errorf("api client: %w", err)
	}
	c.SetToken(rootToken)

	if wantRoot != "" && wantRoot != rootToken {
		if _, err := c.Auth().Token().CreateWithContext(ctx, &api.TokenCreateRequest{
			ID:       wantRoot,
			Policies: []string{"root"},
			NoParent: true,
		}); err != nil {
			return "", fmt.Errorf("create root token with the -root-token ID: %w", err)
		}
		if err := c.Auth().Token().RevokeSelfWithContext(ctx, ""); err != nil {
			return "", fmt.Errorf("revoke the generated root token: %w", err)
		}
		rootToken = wantRoot
		c.SetToken(rootToken)
	}

	if err := c.Sys().MountWithContext(ctx, "secret", &api.MountInput{
		Type:        "kv",
		Description: "key/value secret storage (v2)",
		Options:     map[string]string{"version": "2"},
	}); err != nil {
		return "", fmt.Errorf("enable kv v2 at secret/: %w", err)
	}
	for _, m := range []string{"approle", "jwt"} {
		if err := c.Sys().EnableAuthWithOptionsWithContext(ctx, m, &api.EnableAuthOptions{Type: m}); err != nil {
			return "", fmt.Errorf("enable %s auth: %w", m, err)
		}
	}
	// A KV v2 mount upgrades itself in the background; wait until it serves
	// so the first write by a test does not race the upgrade.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Logical().ReadWithContext(ctx, "secret/config")
		if err == nil {
			return rootToken, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("kv v2 at secret/ not ready: %w", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".vaultdev-ready-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// registry is the builtin plugin registry: exactly kv, aws, approle and jwt. The
// core needs one (a nil registry panics on mount); the factories themselves
// come from CoreConfig's LogicalBackends and CredentialBackends.
type registry struct{}

var builtins = map[consts.PluginType]map[string]logical.Factory{
	consts.PluginTypeSecrets:    {"kv": logicalKv.Factory, "aws": logicalAws.Factory},
	consts.PluginTypeCredential: {"approle": credAppRole.Factory, "jwt": credJWT.Factory},
}

func (registry) Get(name string, t consts.PluginType) (func() (interface{}, error), bool) {
	f, ok := builtins[t][name]
	if !ok {
		return nil, false
	}
	return func() (interface{}, error) { return f, nil }, true
}

func (registry) Contains(name string, t consts.PluginType) bool {
	_, ok := builtins[t][name]
	return ok
}

func (registry) Keys(t consts.PluginType) []string {
	var keys []string
	for k := range builtins[t] {
		keys = append(keys, k)
	}
	return keys
}

func (registry) DeprecationStatus(name string, t consts.PluginType) (consts.DeprecationStatus, bool) {
	if _, ok := builtins[t][name]; ok {
		return consts.Supported, true
	}
	return consts.Unknown, false
}

func (registry) IsBuiltinEntPlugin(string, consts.PluginType) bool { return false }
