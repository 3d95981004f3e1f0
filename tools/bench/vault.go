package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	vault "github.com/hashicorp/vault/api"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// The vault path: the credential path's entry, served by a second egressd whose
// credentials.backend is vault, against a Vault dev server the bench starts
// (scripts/vaultdev.sh's binary). The root token is also egressd's token: the
// bench measures the request path, not the login.

const (
	// scriptOff is the -peers value that skips the peers.
	scriptOff = "off"
	// vaultdevScript builds the server, from the repository root, where make
	// bench runs.
	vaultdevScript    = "scripts/vaultdev.sh"
	vaultBuildTimeout = 15 * time.Minute // a cold build takes minutes
	vaultStartTimeout = 60 * time.Second
	// vaultRefresh is short so that egressd's background reads (never on the
	// request path) fall inside every measured window.
	vaultRefresh  = 2 * time.Second
	vaultKVPrefix = "egressd/credentials" // egressd's default kv_prefix
)

// vaultStack is what the vault path runs on, started on first use so that it
// idles during no other path.
type vaultStack struct {
	started bool
	skip    string
	vault   *vaultdev.Server
	e       *egressd
	w       *world
}

// start starts the stack once; it returns why the path is skipped, if it is.
func (s *vaultStack) start(ctx context.Context, env pathEnv) (string, error) {
	if s.started {
		return s.skip, nil
	}
	s.started = true
	bin, skip := findVaultdev(ctx, env.stderr)
	if s.skip = skip; skip != "" {
		return skip, nil
	}
	vdir := filepath.Join(env.dir, "vault")
	if err := os.MkdirAll(vdir, 0o700); err != nil {
		return "", err
	}
	sctx, cancel := context.WithTimeout(ctx, vaultStartTimeout)
	defer cancel()
	var err error
	if s.vault, err = vaultdev.Start(sctx, bin, vdir, "warn"); err != nil {
		return "", err
	}
	tokenFile := filepath.Join(vdir, "vault-token")
	if err := s.putCredential(ctx, tokenFile); err != nil {
		return "", err
	}
	cfg, files := benchConfig(env.w.up, env.dns.Addr, vaultCredentials(s.vault.Addr, tokenFile), benchMaxConnections)
	if s.e, err = startEgressd(ctx, env.o.egressd, vdir, cfg, files); err != nil {
		return "", fmt.Errorf("egressd with the vault backend: %w", err)
	}
	s.w = &world{up: env.w.up, proxy: s.e.proxyURL}
	s.w.egressdRoots, err = s.e.CAPool()
	return "", err
}

// putCredential writes the vault path's token into Vault and the root token
// into tokenFile.
func (s *vaultStack) putCredential(ctx context.Context, tokenFile string) error {
	cfg := vault.DefaultConfig()
	cfg.Address, cfg.HttpClient = s.vault.Addr, &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second} // no environment proxy
	c, err := vault.NewClient(cfg)
	if err != nil {
		return err
	}
	c.SetToken(s.vault.RootToken)
	if _, err := c.KVv2("secret").Put(ctx, vaultKVPrefix+"/"+credentialID, map[string]any{"token": vaultCredentialToken}); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	return os.WriteFile(tokenFile, []byte(s.vault.RootToken+"\n"), 0o600)
}

// stop stops egressd, then Vault, and returns how egressd ended ("" for exit 0).
func (s *vaultStack) stop() string {
	var exit string
	if s.e != nil {
		exit = s.e.stop()
	}
	if s.vault != nil {
		s.vault.Stop()
	}
	return exit
}

// vaultCredentials is the credentials section of the vault path's egressd.
func vaultCredentials(addr, tokenFile string) *egressdtest.Credentials {
	return &egressdtest.Credentials{Backend: "vault", Vault: &egressdtest.Vault{
		Address: addr, Auth: egressdtest.VaultAuth{Method: "token", TokenFile: tokenFile},
		KVMount: "secret", KVPrefix: vaultKVPrefix, Refresh: vaultRefresh.String(),
	}}
}

// findVaultdev builds the Vault dev server with vaultdevScript, or says why
// the path is skipped.
func findVaultdev(ctx context.Context, stderr io.Writer) (bin, skip string) {
	if _, err := os.Stat(vaultdevScript); err != nil {
		return "", "no " + vaultdevScript + " in the working directory (run from the repository root)"
	}
	fmt.Fprintf(stderr, "bench: vault path: %s build (cached: instant; a cold build takes about 5 minutes; leave vault out of -paths to skip it)\n", vaultdevScript)
	ctx, cancel := context.WithTimeout(ctx, vaultBuildTimeout)
	defer cancel()
	bin, err := vaultdev.Build(ctx, vaultdevScript)
	if err != nil {
		return "", "build failed: " + lastLine(err.Error())
	}
	return bin, ""
}

// runBuild runs `script build names...` within timeout: its stdout, its stderr
// and how it failed.
func runBuild(ctx context.Context, timeout time.Duration, script string, names ...string) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, append([]string{"build"}, names...)...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	return out, errOut.String(), err
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return truncate(s, 300)
}
