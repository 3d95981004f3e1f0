// Package vaultdoc runs docs/vault.md's step-by-step commands as written, so a
// broken Vault instruction fails `make test`. Each ```sh block of the page runs in
// order with bash, in one scratch directory holding egressd built from this tree
// in bin/ and links to the repository's configs/ and scripts/, with the real `vault` CLI (Vault v1.20.4, built by
// scripts/install-vault-cli.sh) first on PATH, against a Vault dev server started
// from the same binary (`vault server -dev`: every built-in auth method, the
// Kubernetes one included). Everything runs inside a loopback-only network
// namespace. A comment at the end of a command names what its output must contain;
// `egressd check` must print no warning. What a block needs from outside (your
// issuer's JWT, a cluster's CA and reviewer token) the test writes first.
package vaultdoc

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

const repoRoot = "../.."

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// TestVaultDoc runs every ```sh block of docs/vault.md.
func TestVaultDoc(t *testing.T) {
	vault := vaultCLI(t)
	work := t.TempDir()
	egressdBin := filepath.Join(work, "bin", "egressd")
	if out, err := exec.Command("go", "build", "-o", egressdBin, repoRoot+"/cmd/egressd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, d := range []string{"configs", "scripts"} {
		abs, _ := filepath.Abs(filepath.Join(repoRoot, d))
		if err := os.Symlink(abs, filepath.Join(work, d)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(cleanEnv(), "PATH="+filepath.Dir(vault)+":"+os.Getenv("PATH"), "HOME="+work)
	env = append(env, startVault(t, vault, env)...)

	blocks := shBlocks(t)
	if len(blocks) < 8 {
		t.Fatalf("docs/vault.md has %d sh blocks; the step by step has more", len(blocks))
	}
	for i, b := range blocks {
		prepare(t, work, b)
		out, err := runBlock(work, env, b)
		if err != nil {
			t.Fatalf("docs/vault.md block %d failed: %v\n%s\noutput:\n%s", i+1, err, b, out)
		}
		for _, want := range expectations(b) {
			if !strings.Contains(out, want) {
				t.Errorf("docs/vault.md block %d: output lacks %q\n%s\noutput:\n%s", i+1, want, b, out)
			}
		}
		if strings.Contains(b, "egressd check") && strings.Contains(out, "warning:") {
			t.Errorf("docs/vault.md block %d: egressd check warns:\n%s", i+1, out)
		}
	}
}

// vaultCLI is the vault binary scripts/install-vault-cli.sh built (make deps
// runs it), or the test skips; make test sets EGRESSD_REQUIRE_VAULT_CLI, which
// makes it fail instead.
func vaultCLI(t *testing.T) string {
	p, _ := filepath.Abs(filepath.Join(repoRoot, ".cache", "bin", "vault"))
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("EGRESSD_REQUIRE_VAULT_CLI") != "" {
			t.Fatalf("no vault CLI at %s: make deps (scripts/install-vault-cli.sh)", p)
		}
		t.Skipf("no vault CLI at %s: make deps (scripts/install-vault-cli.sh)", p)
	}
	// HashiCorp's CLI at the version tools/vaultcli pins, not a stand-in.
	mod, err := os.ReadFile(filepath.Join(repoRoot, "tools", "vaultcli", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/hashicorp/vault (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("tools/vaultcli/go.mod does not require github.com/hashicorp/vault")
	}
	out, err := exec.Command(p, "version").CombinedOutput()
	// "Vault v1.20.4, built ..." or "Vault v1.20.4 (...)": the version, then no more of one.
	if err != nil || !regexp.MustCompile(`^Vault `+regexp.QuoteMeta(string(m[1]))+`[^0-9.]`).Match(out) {
		t.Fatalf("%s version: %v: %q, want Vault %s", p, err, out, m[1])
	}
	return p
}

// startVault starts `vault server -dev` on a free loopback port and returns the
// VAULT_ADDR and VAULT_TOKEN (the dev root token) to use it.
func startVault(t *testing.T, vault string, env []string) []string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	root := "root-" + randomHex(t)
	cmd := exec.Command(vault, "server", "-dev", "-dev-listen-address="+addr, "-dev-root-token-id="+root, "-dev-no-store-token")
	var log bytes.Buffer
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("vault server -dev:\n%s", log.String())
		}
	})
	vars := []string{"VAULT_ADDR=http://" + addr, "VAULT_TOKEN=" + root}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// Ready once the dev server's secret/ mount takes writes: it upgrades the
		// mount to KV v2 after it starts answering, and a write before that fails.
		probe := exec.Command(vault, "kv", "put", "-mount=secret", "vaultdoc-ready", "ok=1")
		probe.Env = append(slices.Clone(env), vars...)
		if probe.Run() == nil {
			clean := exec.Command(vault, "kv", "metadata", "delete", "-mount=secret", "vaultdoc-ready")
			clean.Env = probe.Env
			if err := clean.Run(); err != nil {
				t.Fatal(err)
			}
			return vars
		}
		if time.Now().After(deadline) {
			t.Fatalf("vault server -dev not ready on %s:\n%s", addr, log.String())
		}
	}
}

// prepare writes what a block reads from outside Vault and this repository.
func prepare(t *testing.T, work, block string) {
	t.Helper()
	dir := filepath.Join(work, "egressd-vault")
	switch {
	case strings.Contains(block, "auth/jwt/login"):
		writeFile(t, filepath.Join(dir, "jwt"), issuerJWT(t, filepath.Join(dir, "issuer.key")))
	case strings.Contains(block, "auth/kubernetes/config"):
		writeFile(t, filepath.Join(dir, "kube-ca.crt"), string(testpki.New(t).PEM()))
		writeFile(t, filepath.Join(dir, "reviewer.jwt"), issuerJWT(t, filepath.Join(dir, "issuer.key")))
	}
}

// issuerJWT is what an identity provider would issue egressd: signed with the
// key the doc made, for subject egressd and audience vault.
func issuerJWT(t *testing.T, keyFile string) string {
	t.Helper()
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: not PEM", keyFile)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{
		Issuer: "https://issuer.example", Subject: "egressd", Audience: jwt.Audience{"vault"},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)),
		Expiry: jwt.NewNumericDate(now.Add(10 * time.Minute)),
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// shBlocks returns docs/vault.md's ```sh blocks in order.
func shBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "vault.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out
}

// expectations are the trailing comments of a block's commands: what each prints.
func expectations(block string) []string {
	var out []string
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if _, c, ok := strings.Cut(line, "   # "); ok {
			out = append(out, strings.TrimSpace(c))
		}
	}
	return out
}

func runBlock(dir string, env []string, block string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", block)
	var out bytes.Buffer
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &out, &out
	err := cmd.Run()
	return out.String(), err
}

// cleanEnv is this environment without Vault settings or proxies.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "VAULT_") && !strings.Contains(strings.ToLower(name), "proxy") && name != "PATH" && name != "HOME" {
			env = append(env, kv)
		}
	}
	return env
}

func randomHex(t *testing.T) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
