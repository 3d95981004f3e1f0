package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// The vault path: the credential path's entry, served by a second egressd whose
// credentials.backend is vault, against a Vault dev server the bench starts
// (scripts/vaultdev.sh's binary: in-memory, unsealed, KV v2 at secret/, on
// 127.0.0.1). The secret is written once through Vault's HTTP API with the
// root token, which is also egressd's token (token auth: the bench measures
// the request path, not the login).

const (
	// vaultdevOff is the -vaultdev value that skips the vault path.
	vaultdevOff = "off"
	// vaultdevScript is where the bench looks for the build script when
	// -vaultdev is not given: the repository root, where make bench runs.
	vaultdevScript = "scripts/vaultdev.sh"
	// vaultBuildTimeout bounds `scripts/vaultdev.sh build`: milliseconds when
	// the binary is cached, about 5 minutes for a cold build.
	vaultBuildTimeout = 15 * time.Minute
	// vaultStartTimeout bounds the wait for the server's ready file.
	vaultStartTimeout = 60 * time.Second
	// vaultRefresh is the vault egressd's credentials.vault.refresh: short, so
	// that its background reads (never on the request path) fall inside every
	// measured window.
	vaultRefresh = 2 * time.Second
)

// findVaultdev returns the Vault dev server binary for the vault path, or why the
// path is skipped. flag is -vaultdev: "off", a path (which must exist: an error
// otherwise), or "" for scripts/vaultdev.sh build in the working directory, when
// there is one.
func findVaultdev(ctx context.Context, flag string, stderr io.Writer) (bin, skip string, err error) {
	switch flag {
	case vaultdevOff:
		return "", "-vaultdev " + vaultdevOff, nil
	case "":
	default:
		abs, err := executable(flag)
		if err != nil {
			return "", "", fmt.Errorf("-vaultdev %s: %v; build one with scripts/vaultdev.sh build, or -vaultdev %s", flag, err, vaultdevOff)
		}
		return abs, "", nil
	}
	if _, err := os.Stat(vaultdevScript); err != nil {
		return "", "no -vaultdev and no " + vaultdevScript + " in the working directory (run from the repository root, or pass -vaultdev PATH)", nil
	}
	fmt.Fprintf(stderr, "bench: vault path: %s build (cached: instant; a cold build takes about 5 minutes; -vaultdev %s skips the path)\n", vaultdevScript, vaultdevOff)
	out, errOut, err := runBuild(ctx, vaultBuildTimeout, vaultdevScript)
	if err != nil {
		return "", fmt.Sprintf("%s build failed (%v): %s", vaultdevScript, err, lastLine(errOut)), nil
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", vaultdevScript + " build printed no path", nil
	}
	return f[len(f)-1], "", nil
}

// executable is path, absolute, when it names an executable file.
func executable(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(abs); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("not an executable (%v)", err)
	}
	return abs, nil
}

// runBuild runs `script build names...` (scripts/vaultdev.sh, scripts/peers.sh)
// within timeout: its stdout, its stderr and how it failed.
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

// vaultServer is the Vault dev server subprocess (internal/testutil/vaultdev).
type vaultServer struct{ *vaultdev.Server }

// startVault runs bin on 127.0.0.1:0 with its files in dir and waits until it
// is ready.
func startVault(ctx context.Context, bin, dir string) (*vaultServer, error) {
	ctx, cancel := context.WithTimeout(ctx, vaultStartTimeout)
	defer cancel()
	s, err := vaultdev.Start(ctx, bin, dir, "warn")
	if err != nil {
		return nil, err
	}
	return &vaultServer{s}, nil
}

// putKV writes data as a new version of secret/data/<path> (KV v2).
func (v *vaultServer) putKV(ctx context.Context, path string, data map[string]any) error {
	body, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.Addr+"/v1/secret/data/"+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Vault-Token", v.RootToken)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: adminTimeout}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("vault: writing secret/data/%s: status %d: %s", path, resp.StatusCode, truncate(string(msg), 300))
	}
	return nil
}

// vaultStack is what the vault path runs on: the Vault server and the egressd
// that reads the credential from it.
type vaultStack struct {
	vault *vaultServer
	e     *egressd
	w     *world
}

// startVaultStack starts Vault, writes the credential into it and starts the
// second egressd in dir/vault, configured as the first but for its credentials.
func startVaultStack(ctx context.Context, o options, vaultBin, dir string, up *upstream, dnsAddr string) (*vaultStack, error) {
	vdir := filepath.Join(dir, "vault")
	if err := os.MkdirAll(vdir, 0o700); err != nil {
		return nil, err
	}
	v, err := startVault(ctx, vaultBin, vdir)
	if err != nil {
		return nil, err
	}
	s := &vaultStack{vault: v}
	if err := v.putKV(ctx, vaultKVPrefix+"/"+credentialID, map[string]any{"token": vaultCredentialToken}); err != nil {
		s.stop()
		return nil, err
	}
	tokenFile := filepath.Join(vdir, "vault-token")
	if err := os.WriteFile(tokenFile, []byte(v.RootToken+"\n"), 0o600); err != nil {
		s.stop()
		return nil, err
	}
	cfg, files := benchConfig(up, dnsAddr, vaultCredentials(v.Addr, tokenFile), benchMaxConnections)
	if s.e, err = startEgressd(ctx, o.egressd, vdir, cfg, files); err != nil {
		s.stop()
		return nil, fmt.Errorf("egressd with the vault backend: %w", err)
	}
	s.w = &world{up: up, proxy: s.e.proxyURL}
	if s.w.egressdRoots, err = s.e.CAPool(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// stop stops egressd, then Vault, and returns how egressd ended ("" for exit 0).
func (s *vaultStack) stop() string {
	var exit string
	if s.e != nil {
		exit = s.e.stop()
	}
	s.vault.Stop()
	return exit
}

// vaultKVPrefix is credentials.vault.kv_prefix (egressd's default).
const vaultKVPrefix = "egressd/credentials"
