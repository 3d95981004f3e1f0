// Package vaultdev runs the tests' Vault dev server (the binary scripts/vaultdev.sh
// builds: in-memory, unsealed, KV v2 at secret/) as a subprocess on 127.0.0.1, for
// the suites that run egressd against a real Vault (cmd/egressd, bench).
//
// Invariant: the server listens on 127.0.0.1 only; Start fails otherwise.
package vaultdev

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/egressd/egressd/internal/testutil/proc"
)

// Build runs `script build` (scripts/vaultdev.sh: instant when cached, minutes
// cold) and returns the executable it printed last.
func Build(ctx context.Context, script string) (string, error) {
	cmd := exec.CommandContext(ctx, script, "build")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s build: %v\n%s", script, err, tail(stderr.String(), 2000))
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "", fmt.Errorf("%s build printed no path", script)
	}
	path := f[len(f)-1]
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s build printed %s, which is not an executable (%v)", script, path, err)
	}
	return path, nil
}

// Server is one running Vault dev server.
type Server struct {
	Addr      string // http://127.0.0.1:port
	RootToken string
	UnsealKey string
	LogPath   string // its stderr

	p *proc.Proc
}

// Client is a client of s's HTTP API with the root token; it never uses the
// environment's proxy.
func (s *Server) Client() (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.HttpClient = s.Addr, &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	c, err := api.NewClient(cfg)
	if err == nil {
		c.SetToken(s.RootToken)
	}
	return c, err
}

// Start runs bin on 127.0.0.1:0 at logLevel ("warn", "error"), with its ready file
// and log in dir, and waits (bounded by ctx) for the ready file.
func Start(ctx context.Context, bin, dir, logLevel string) (*Server, error) {
	ready := filepath.Join(dir, "vault-ready.json")
	s := &Server{LogPath: filepath.Join(dir, "vault.log")}
	var err error
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-ready-file", ready, "-log-level", logLevel)
	if s.p, err = proc.Start(cmd, "", s.LogPath, syscall.SIGKILL); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx, ready); err != nil {
		s.Stop()
		return nil, fmt.Errorf("vault: %w; its log: %s", err, s.Log(2000))
	}
	if u, err := url.Parse(s.Addr); err != nil || u.Hostname() != "127.0.0.1" {
		s.Stop()
		return nil, fmt.Errorf("vault listens on %q, not on 127.0.0.1", s.Addr)
	}
	return s, nil
}

// waitReady reads the ready file once it is complete (it ends with a newline).
func (s *Server) waitReady(ctx context.Context, ready string) error {
	for {
		b, err := os.ReadFile(ready)
		if err == nil && bytes.HasSuffix(b, []byte("\n")) {
			var r struct {
				Addr      string `json:"addr"`
				RootToken string `json:"root_token"`
				UnsealKey string `json:"unseal_key"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("ready file %s: %w", ready, err)
			}
			s.Addr, s.RootToken, s.UnsealKey = r.Addr, r.RootToken, r.UnsealKey
			return nil
		}
		if err := s.p.Pause(ctx, 20*time.Millisecond); err != nil {
			return fmt.Errorf("not ready: %w", err)
		}
	}
}

// Stop kills the server and waits for it. It may be called more than once.
func (s *Server) Stop() { s.p.Kill() }

// Log is the end (about n bytes) of the server's log.
func (s *Server) Log(n int) string { return proc.Tail(s.LogPath, n) }

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
