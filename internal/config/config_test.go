package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
)

// The shipped configs load cleanly: no errors and no warnings (dev-local
// warns on purpose, about unsafe_allow_cidrs only).
func TestShippedConfigsLoad(t *testing.T) {
	t.Setenv("VAULT_ADDR", "")
	cfg, err := Load("../../configs/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("quickstart warnings: %v", cfg.Warnings)
	}
	if !filepath.IsAbs(cfg.Policy.File) || filepath.Base(cfg.Policy.File) != "environment.json" {
		t.Errorf("policy file %q: want the absolute path of configs/environment.json", cfg.Policy.File)
	}
	if cfg.Rules == nil || cfg.Rules.Allowlist == nil || len(cfg.Rules.Entries) != 7 {
		t.Errorf("quickstart policy not loaded: %+v", cfg.Rules)
	}

	dev, err := Load("../../configs/dev-local.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(dev.Warnings) != 1 || dev.Warnings[0].Path != "network.unsafe_allow_cidrs" {
		t.Errorf("dev-local warnings: %v", dev.Warnings)
	}
}

func TestShippedPolicyLoads(t *testing.T) {
	p, err := LoadPolicy("../../configs/environment.json", Default().AllowlistOptions())
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 0 || p.HooksJSON != nil {
		t.Errorf("warnings %v, hooks %q", p.Warnings, p.HooksJSON)
	}
	for _, e := range p.Entries {
		if e.Domain == "*" {
			t.Error("the shipped policy must not allow everything")
		}
	}
}

func TestShippedCredentialsAreJSON(t *testing.T) {
	var creds map[string]struct{ Token string }
	if err := json.Unmarshal(readTestFile(t, "../../configs/credentials.json"), &creds); err != nil {
		t.Fatal(err)
	}
	if creds["example-api"].Token == "" {
		t.Error("example-api has no token")
	}
}

// Default is the quick-start config: configs/quickstart.yaml says the same
// thing, apart from its environment name and where paths resolve.
func TestDefaultMatchesQuickstart(t *testing.T) {
	def := Default()
	qs, err := Parse(readTestFile(t, "../../configs/quickstart.yaml"), "../../configs")
	if err != nil {
		t.Fatal(err)
	}
	if def.Environment != DefaultEnvironment || def.Rules != nil || def.Hash != "" {
		t.Errorf("Default: environment %q, rules %v, hash %q", def.Environment, def.Rules, def.Hash)
	}
	if def.Policy.File != DefaultPolicyFile || def.Credentials.File != DefaultCredentialsFile || def.StateDir != DefaultStateDir {
		t.Errorf("Default paths: %q %q %q", def.Policy.File, def.Credentials.File, def.StateDir)
	}
	// Align what legitimately differs, then compare everything else.
	qs.Environment = def.Environment
	qs.Policy.File, qs.Credentials.File, qs.StateDir = def.Policy.File, def.Credentials.File, def.StateDir
	qs.TLS.CAPublicDir = def.TLS.CAPublicDir
	qs.Rules, qs.Hash, qs.Warnings = nil, "", nil
	qs.raw, qs.baseDir = def.raw, def.baseDir // what each was read from
	if !reflect.DeepEqual(def, qs) {
		t.Errorf("Default and quickstart.yaml differ:\n%s\nvs\n%s", renderResult(def, nil), renderResult(qs, nil))
	}
}

func TestLoadDefault(t *testing.T) {
	t.Chdir("../..")
	cfg, err := LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules == nil || len(cfg.Rules.Entries) == 0 {
		t.Fatal("policy not loaded")
	}
	sum := sha256.Sum256(readTestFile(t, DefaultPolicyFile))
	if cfg.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("hash %s: want the policy file's sha256", cfg.Hash)
	}
}

// Hash is `cat egressd.yaml environment.json | sha256sum`.
func TestHashCoversConfigAndPolicy(t *testing.T) {
	cfgData := readTestFile(t, "testdata/golden/config_defaults.yaml")
	cfg, err := Parse(cfgData, "testdata/golden")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(cfgData, readTestFile(t, "testdata/golden/policy_network.json")...))
	if cfg.Hash != hex.EncodeToString(sum[:]) {
		t.Errorf("hash %s, want %x", cfg.Hash, sum)
	}
}

// Relative paths resolve against the config file's directory, whatever
// the working directory.
func TestLoadResolvesPathsAgainstConfigDir(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "env", "environment.json"), `{"allowlist": [{"domain": "github.com"}]}`)
	writeFile(t, filepath.Join(dir, "egressd.yaml"), `version: 1
listeners: [{name: sandbox, address: 127.0.0.1:0}]
policy: {file: env/environment.json}
credentials: {file: creds.json}
tls: {ca_cert: /abs/ca.pem, ca_key: ca.key}
`)
	t.Chdir(t.TempDir())
	cfg, err := Load(filepath.Join(dir, "egressd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		cfg.Policy.File:      filepath.Join(dir, "env", "environment.json"),
		cfg.Credentials.File: filepath.Join(dir, "creds.json"),
		cfg.TLS.CAKey:        filepath.Join(dir, "ca.key"),
		cfg.TLS.CACert:       "/abs/ca.pem",
		cfg.StateDir:         filepath.Join(dir, ".egressd"),
	}
	for got, w := range want {
		if got != w {
			t.Errorf("got %q, want %q", got, w)
		}
	}
}

func TestLoadReadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	if _, err := LoadPolicy(t.TempDir(), allowlist.Options{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("policy directory: %v", err)
	}
}

// LoadPolicy names the file on every problem.
func TestLoadPolicyNamesFile(t *testing.T) {
	path := "testdata/golden/policy_bad_entry_key.json"
	_, err := LoadPolicy(path, allowlist.Options{})
	ve := asValidationError(t, err)
	for _, p := range ve.Problems {
		if p.File != path {
			t.Errorf("problem %v: file %q, want %q", p, p.File, path)
		}
	}
}

// Warnings never fail a load; they come back on the result.
func TestWarningsDoNotFail(t *testing.T) {
	cfg, err := Parse([]byte(`version: 1
listeners: [{name: t, address: 127.0.0.1:15006, mode: transparent}]
policy: {allowlist: []}
network: {unsafe_allow_cidrs: [127.0.0.0/8]}
credentials: {file: c.json}
`), "")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, w := range cfg.Warnings {
		if !w.Warning {
			t.Errorf("not marked a warning: %v", w)
		}
		paths = append(paths, w.Path)
	}
	want := []string{"listeners[0].address", "policy.allowlist", "network.unsafe_allow_cidrs"}
	if fmt.Sprint(paths) != fmt.Sprint(want) {
		t.Errorf("warnings at %v, want %v", paths, want)
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want string
	}{
		{Problem{Path: "listeners[1].address", Line: 7, Msg: "bad"}, "listeners[1].address: bad (line 7)"},
		{Problem{Path: "version", Msg: "required"}, "version: required"},
		{Problem{Path: "a", Msg: "m", Warning: true}, "warning: a: m"},
		{Problem{Path: "policy", Msg: "m", File: "e.json", Line: 3, Column: 5}, "policy: m (e.json, line 3, column 5)"},
		{Problem{Msg: "m", File: "e.json"}, "m (e.json)"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	err := &ValidationError{Problems: []Problem{{Path: "a", Line: 1, Msg: "x"}, {Path: "b", Msg: "y", Warning: true}}}
	if got, want := err.Error(), "invalid configuration:\n  a: x (line 1)\n  warning: b: y"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A config with a great many problems reports the first maxProblems and
// counts the rest.
func TestProblemsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\n")
	for i := range 150 {
		fmt.Fprintf(&b, "unknown_%d: x\n", i)
	}
	ve := asValidationError(t, parseErr(t, b.String()))
	if len(ve.Problems) != maxProblems+1 {
		t.Fatalf("%d problems, want %d", len(ve.Problems), maxProblems+1)
	}
	if last := ve.Problems[maxProblems].Msg; !strings.Contains(last, "more problems not shown") {
		t.Errorf("last problem %q", last)
	}
}

// The Vault token is redacted however a Config is printed.
func TestVaultTokenRedacted(t *testing.T) {
	cfg := Default()
	cfg.Credentials.Vault.Auth.Token = "s.super-secret"
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", *cfg), fmt.Sprintf("%#v", cfg.Credentials), string(js)} {
		if strings.Contains(s, "super-secret") {
			t.Errorf("token leaked: %s", s)
		}
		if !strings.Contains(s, "redacted") {
			t.Errorf("no redaction marker: %s", s)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{5 * time.Minute: "5m", time.Hour: "1h", 30 * time.Second: "30s", 90 * time.Minute: "1h30m"} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSuggest(t *testing.T) {
	known := []string{"name", "address", "mode", "role"}
	for key, want := range map[string]string{
		"adress": "address", "Address": "address", "nmae": "name", "rol": "role",
		"roles": "role", "listen": "", "": "", strings.Repeat("a", 100): "",
	} {
		if got := Suggest(key, known); got != want {
			t.Errorf("suggest(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"a", "", 1}, {"kitten", "sitting", 3}, {"adress", "address", 1}, {"dail", "dial", 2}, {"é", "e", 1}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// JSON and inline YAML entries mean the same thing.
func TestInlineAndJSONEntriesAgree(t *testing.T) {
	cfg, err := Parse([]byte(`version: 1
listeners: [{name: s, address: 127.0.0.1:0}]
credentials: {file: c.json}
policy:
  allowlist:
    - {domain: a.example.com, ports: [443, 8443], credential: a}
    - {domain: b.example.com, transform: [{X-A: "1"}, {X-B: "2"}], allow_plaintext: true}
`), "")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := ParsePolicy([]byte(`{"allowlist": [
  {"domain": "a.example.com", "ports": [443, 8443], "credential": "a"},
  {"domain": "b.example.com", "transform": [{"X-A": "1"}, {"X-B": "2"}], "allow_plaintext": true}]}`), cfg.AllowlistOptions())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Policy.Inline, pol.Entries) || !reflect.DeepEqual(cfg.Rules.Entries, pol.Entries) {
		t.Errorf("inline %+v\njson %+v", cfg.Policy.Inline, pol.Entries)
	}
}

func parseErr(t *testing.T, yaml string) error {
	t.Helper()
	_, err := Parse([]byte(yaml), "")
	return err
}

func asValidationError(t *testing.T, err error) *ValidationError {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want a *ValidationError, got %T: %v", err, err)
	}
	return ve
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A misspelt key hides the "required" problem of the key it suggests, but
// not the problems of that key when it is present too.
func TestSuggestionHidesOnlyMissing(t *testing.T) {
	ve := asValidationError(t, parseErr(t, `version: 1
listeners:
  - {name: a, adress: 127.0.0.1:1}
  - {name: b, address: localhost:1, adress: x}
policy: {file: x.json}
credentials: {file: c.json}
`))
	var got []string
	for _, p := range ve.Problems {
		if strings.HasPrefix(p.Path, "listeners") {
			got = append(got, p.Path)
		}
	}
	want := []string{"listeners[0].adress", "listeners[1].adress", "listeners[1].address"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("problems at %v, want %v\n%v", got, want, ve)
	}
}
