package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

func TestLogSummary(t *testing.T) {
	lines := []string{
		`{"level":"info","req_id":"a-1","method":"GET","scheme":"http","decision":"allow","reason":"","status":200,"error":"","message":"egress"}`,
		`{"level":"info","req_id":"a-2","method":"CONNECT","scheme":"connect","decision":"allow","reason":"","status":200,"scrubbed":0,"error":"","message":"egress"}`,
		`{"level":"info","req_id":"a-5","method":"GET","scheme":"https","decision":"allow","reason":"","status":200,"scrubbed":1,"error":"","message":"egress"}`,
		`{"level":"warn","rule":"cred.bench.test","credential":"bench-cred","message":"an upstream reflected a value egressd injected; it was masked in the response"}`,
		`{"level":"info","req_id":"a-3","method":"GET","scheme":"http","decision":"error","reason":"upstream_unreachable","status":502,"error":"dial tcp 127.0.0.1:4242: connect: connection refused","message":"egress"}`,
		`{"level":"info","req_id":"a-4","method":"GET","scheme":"http","decision":"error","reason":"upstream_unreachable","status":502,"error":"dial tcp 127.0.0.1:4343: connect: connection refused","message":"egress"}`,
		`{"level":"info","message":"draining"}`,
		`{"level":"warn","error":"boom","message":"drain timed out"}`,
		`not json`,
	}
	var s logSummary
	for _, l := range lines {
		s.add([]byte(l))
	}
	if s.Lines != 9 || s.EgressLines != 5 || s.Allowed200 != 3 || s.Scrubbed != 1 {
		t.Errorf("lines %d, egress %d, allowed %d, scrubbed %d; want 9, 5, 3, 1", s.Lines, s.EgressLines, s.Allowed200, s.Scrubbed)
	}
	want := map[string]int64{
		"GET http: decision=error status=502 reason=upstream_unreachable error=dial tcp 127.x:port: connect: connection refused": 2,
		"warn: drain timed out: boom": 1,
		"unparsed line: not json":     1,
	}
	if len(s.Unexpected) != len(want) {
		t.Errorf("unexpected = %v, want %v", s.Unexpected, want)
	}
	for k, n := range want {
		if s.Unexpected[k] != n {
			t.Errorf("unexpected[%q] = %d, want %d (all: %v)", k, s.Unexpected[k], n, s.Unexpected)
		}
	}
	if len(s.Examples) != 4 {
		t.Errorf("%d examples, want 4", len(s.Examples))
	}
}

// loadConfig writes cfg and files into a temp dir and loads the config as
// egressd does, so every test of a config is a test that egressd accepts it.
func loadConfig(t *testing.T, cfg *egressdtest.Config, files map[string]string) (*config.Config, string) {
	t.Helper()
	dir := t.TempDir()
	b, err := cfg.YAML()
	if err != nil {
		t.Fatal(err)
	}
	files[egressdtest.ConfigName] = string(b)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := config.Load(filepath.Join(dir, egressdtest.ConfigName))
	if err != nil {
		t.Fatalf("config does not load: %v\n%s", err, b)
	}
	return c, string(b)
}

// testUpstream is an upstream that is not running, for configs.
func testUpstream() *upstream {
	return &upstream{httpAddr: "127.0.0.1:1080", tlsAddr: "127.0.0.1:1443", caPEM: testCAPEM}
}

// testCAPEM is a CA certificate egressd's tls.upstream_ca_file accepts.
var testCAPEM = func() []byte {
	ca, err := testpki.NewCA("bench test CA")
	if err != nil {
		panic(err)
	}
	return ca.PEM()
}()

func TestConfigNamesOnlyLoopback(t *testing.T) {
	cfg, files := benchConfig(testUpstream(), "127.0.0.1:5353", nil, benchMaxConnections)
	creds := files[credentialsFile]
	_, y := loadConfig(t, cfg, files)
	for _, want := range []string{
		"ports: [1080, 1443]", "address: 127.0.0.1:0", "unsafe_allow_cidrs: [127.0.0.0/8]", "level: info",
		"resolver: 127.0.0.1:5353", "domain: inject.bench.test", "X-Bench-Injected: bench-transform-value",
		"domain: cred.bench.test", "credential: bench-cred", "intercept: auto", "max_connections: 8192",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("config lacks %q:\n%s", want, y)
		}
	}
	var parsed map[string]map[string]any
	if err := json.Unmarshal([]byte(creds), &parsed); err != nil || parsed[credentialID]["token"] != credentialToken ||
		parsed[githubCredentialID]["type"] != "github_app" {
		t.Errorf("credentials.json = %s (%v)", creds, err)
	}
}

// TestVaultConfig: the vault path's egressd has the same config but for its
// credentials section, which names the Vault on 127.0.0.1 and a token file, and
// no credentials.json is written for it.
func TestVaultConfig(t *testing.T) {
	cfg, files := benchConfig(testUpstream(), "127.0.0.1:5353", vaultCredentials("http://127.0.0.1:8200", "/tmp/x/vault-token"), benchMaxConnections)
	if _, ok := files[credentialsFile]; ok {
		t.Error("credentials.json written for the vault egressd")
	}
	_, y := loadConfig(t, cfg, files)
	for _, want := range []string{
		"domain: cred.bench.test", "credential: bench-cred", "backend: vault", "address: http://127.0.0.1:8200",
		"token_file: /tmp/x/vault-token", "kv_prefix: egressd/credentials", "refresh: 2s",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("config lacks %q:\n%s", want, y)
		}
	}
	if strings.Contains(y, "credentials.json") || strings.Contains(y, oauthHost) {
		t.Errorf("the vault config names credentials.json or the oauth2 entry:\n%s", y)
	}
}
