package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/egressd/egressd/configs"
	"github.com/egressd/egressd/internal/atomicfile"
	"github.com/egressd/egressd/internal/config"
)

// loaded is a validated config with its compiled policy.
type loaded struct {
	cfg    *config.Config
	policy *config.Policy
}

// load reads the config at path and the policy it names; without a path, the
// quick-start defaults (loadQuickstart).
func load(path string) (*loaded, error) {
	var cfg *config.Config
	var err error
	if path == "" {
		cfg, err = loadQuickstart()
	} else {
		cfg, err = config.Load(path)
	}
	if err != nil {
		return nil, err
	}
	if cfg.Hooks.File != "" {
		// The active config's hash covers hooks.json too, so /healthz and the reload
		// log show a change to it. A read failure is reported when hooks are loaded.
		if data, err := os.ReadFile(cfg.Hooks.File); err == nil {
			sum := sha256.Sum256(append([]byte(cfg.Hash), data...))
			cfg.Hash = hex.EncodeToString(sum[:])
		}
	}
	return &loaded{cfg: cfg, policy: cfg.Rules}, nil
}

// loadQuickstart loads the quick-start defaults: from configs/ when the working
// directory is the repository root, else from the copies of the embedded files in
// the state dir (written once, never overwritten: edits to them stay).
func loadQuickstart() (*config.Config, error) {
	if _, err := os.Stat(config.DefaultPolicyFile); err == nil {
		return config.LoadDefault()
	}
	dir := filepath.Join(config.DefaultStateDir, "quickstart")
	policy, creds := filepath.Join(dir, "environment.json"), filepath.Join(dir, "credentials.json")
	for file, data := range map[string][]byte{policy: configs.Environment, creds: configs.Credentials} {
		if _, err := os.Stat(file); err == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("quick start: %w", err)
		}
		if err := atomicfile.Write(file, data, 0o600); err != nil {
			return nil, fmt.Errorf("quick start: %w", err)
		}
	}
	return config.LoadDefaultFiles(policy, creds)
}

// newFlags returns a flag set with the flags every command shares.
func newFlags(name string, out io.Writer) (*flag.FlagSet, *string, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	cfgPath := fs.String("config", "", "operator config `FILE` (egressd.yaml)")
	format := fs.String("format", "text", "output format: text or json")
	return fs, cfgPath, format
}

// printLoadError prints a load error; validation errors list every problem.
func printLoadError(w io.Writer, err error) {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		fmt.Fprintln(w, verr.Error())
		return
	}
	fmt.Fprintf(w, "egressd: %v\n", err)
}

var stderr io.Writer = os.Stderr
