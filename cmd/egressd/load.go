package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/egressd/egressd/internal/config"
)

// loaded is a validated config with its compiled policy.
type loaded struct {
	cfg    *config.Config
	policy *config.Policy
}

// load reads the config at path and the policy it names; without a path, the
// quick-start defaults with configs/environment.json from the working directory.
func load(path string) (*loaded, error) {
	var cfg *config.Config
	var err error
	if path == "" {
		cfg, err = config.LoadDefault()
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
