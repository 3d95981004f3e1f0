package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/testutil/testpki"
	mitm "github.com/egressd/egressd/internal/tls"
)

// startConfig is a valid config whose tls and hooks sections a case fills in.
// Every address is port 0, so `run` binds nothing fixed before it refuses.
const startConfig = `version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
policy: {file: DIR/environment.json}
credentials: {file: DIR/credentials.json}
state_dir: DIR/state
`

// startFiles writes the files the start cases name: a CA (ca.pem, ca-key.pem), a key
// of another CA (other-key.pem), a file that is not PEM (junk.pem) and a directory
// (adir) that cannot be read as a file.
func startFiles(t *testing.T) string {
	t.Helper()
	ca, other := testpki.New(t), testpki.New(t)
	dir := writeFiles(t, map[string]string{
		"environment.json": `{"network": {"allowlist": [{"domain": "example.com"}]}}`,
		"credentials.json": `{}`,
		"ca.pem":           string(ca.PEM()),
		"ca-key.pem":       string(ca.KeyPEM()),
		"other-key.pem":    string(other.KeyPEM()),
		"junk.pem":         "not PEM at all\n",
	})
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startCases are configs that `run` refuses to start with, and the exact message
// (DIR is the case's directory) that `run` logs and `check` prints.
var startCases = []struct {
	name, extra string
	state       map[string]string // files put in state_dir first; a "" key makes state_dir a file
	want        string
}{
	{"ca_key missing", "tls: {ca_cert: DIR/ca.pem, ca_key: DIR/missing-key.pem}", nil,
		"CA key: open DIR/missing-key.pem: no such file or directory"},
	{"ca_key unreadable", "tls: {ca_cert: DIR/ca.pem, ca_key: DIR/adir}", nil,
		"CA key: read DIR/adir: is a directory"},
	{"ca_key of another CA", "tls: {ca_cert: DIR/ca.pem, ca_key: DIR/other-key.pem}", nil,
		"invalid interception CA: the key in DIR/other-key.pem does not match the certificate in DIR/ca.pem"},
	{"ca_key not a key", "tls: {ca_cert: DIR/ca.pem, ca_key: DIR/junk.pem}", nil,
		"invalid interception CA: DIR/junk.pem: no PEM private key block (PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY)"},
	{"ca_cert unreadable", "tls: {ca_cert: DIR/adir, ca_key: DIR/ca-key.pem}", nil,
		"CA certificate: read DIR/adir: is a directory"},
	{"ca_cert not a certificate", "tls: {ca_cert: DIR/junk.pem, ca_key: DIR/ca-key.pem}", nil,
		"invalid interception CA: DIR/junk.pem: no PEM CERTIFICATE block"},
	{"state dir CA without its key", "", map[string]string{mitm.CACertName: "x"},
		"invalid interception CA: DIR/state/" + mitm.CACertName + " exists but DIR/state/" + mitm.CAKeyName +
			" does not; restore the key or remove both to generate a new CA"},
	{"upstream_ca_file missing", "tls: {upstream_ca_file: DIR/missing.pem}", nil,
		"tls.upstream_ca_file: open DIR/missing.pem: no such file or directory"},
	{"upstream_ca_file without a certificate", "tls: {upstream_ca_file: DIR/junk.pem}", nil,
		"tls.upstream_ca_file: DIR/junk.pem holds no PEM certificate"},
	{"hook signing key file missing", "hooks: {signing_key: {file: DIR/missing-key.pem}}", nil,
		"hook signing key: open DIR/missing-key.pem: no such file or directory"},
	{"state dir signing key corrupt", "", map[string]string{hooks.KeyFileName: "junk"}, ""},
	{"state dir is a file", "", map[string]string{"": "not a directory"},
		"stat DIR/state/" + mitm.CACertName + ": not a directory"},
}

// TestCheckFindsWhatRunRefuses: for every config `run` refuses at start, `check`
// exits 1 and prints the very message `run` logs; and check writes nothing to the
// state dir.
func TestCheckFindsWhatRunRefuses(t *testing.T) {
	for _, tc := range startCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := startFiles(t)
			for name, content := range tc.state {
				writeState(t, dir, name, content)
			}
			cfg := filepath.Join(dir, "egressd.yaml")
			body := strings.ReplaceAll(startConfig+tc.extra+"\n", "DIR", dir)
			if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			runMsg := runStartError(t, cfg)
			if want := strings.ReplaceAll(tc.want, "DIR", dir); tc.want != "" && runMsg != want {
				t.Errorf("run logged %q, want %q", runMsg, want)
			}
			res := egressd(t, "check", "--config", cfg)
			if res.code != 1 || !hasLine(res.stdout, "error: "+runMsg) {
				t.Errorf("check: %s\nwant exit 1 and the line %q", res, "error: "+runMsg)
			}
			rep := decodeCheck(t, egressd(t, "check", "--config", cfg, "--format", "json"))
			if *rep.OK || !hasError(rep, runMsg) {
				t.Errorf("check --format json: ok %t, problems %+v; want false and %q", *rep.OK, rep.Problems, runMsg)
			}
		})
	}
}

// TestCheckWritesNothing: a config whose CA and signing key run would generate passes
// check, and check leaves the state dir as it was (absent).
func TestCheckWritesNothing(t *testing.T) {
	dir := startFiles(t)
	cfg := filepath.Join(dir, "egressd.yaml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(startConfig, "DIR", dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := egressd(t, "check", "--config", cfg); res.code != 0 || strings.TrimSpace(res.stdout) != "ok" {
		t.Errorf("check: %s\nwant exit 0 and ok", res)
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); !os.IsNotExist(err) {
		t.Errorf("check created the state dir (stat: %v)", err)
	}
}

func writeState(t *testing.T, dir, name, content string) {
	t.Helper()
	state := filepath.Join(dir, "state")
	if name == "" {
		if err := os.WriteFile(state, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runStartError runs `egressd run` on cfg, which must refuse to start (exit 2), and
// returns the error of its "egressd failed to start" log line.
func runStartError(t *testing.T, cfg string) string {
	t.Helper()
	res := egressd(t, "run", "--config", cfg)
	if res.code != exitRuntime {
		t.Fatalf("run: %s\nwant exit %d (failed to start)", res, exitRuntime)
	}
	sc := bufio.NewScanner(strings.NewReader(res.stdout))
	for sc.Scan() {
		var line struct{ Message, Error string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "egressd failed to start" {
			return line.Error
		}
	}
	t.Fatalf("run: no \"egressd failed to start\" line\n%s", res)
	return ""
}

func hasError(rep checkReportJSON, msg string) bool {
	for _, p := range rep.Problems {
		if p.Message == msg && !p.Warning {
			return true
		}
	}
	return false
}

func hasLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if l == line {
			return true
		}
	}
	return false
}
