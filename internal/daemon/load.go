package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/egressd/egressd/configs"
	"github.com/egressd/egressd/internal/atomicfile"
	"github.com/egressd/egressd/internal/config"
)

// Loaded is a validated config with its compiled policy.
type Loaded struct {
	Cfg    *config.Config
	Policy *config.Policy
	// Sandbox is a node-mode sandbox's ID (LoadSandbox); "" for egressd's own config.
	Sandbox string
	// Netns is the network namespace the sandbox's listeners open in; "" for
	// egressd's own.
	Netns string
	// Share is what a sandbox's spec asks of the node's budgets.
	Share config.Share
}

// Load reads the config at path and the policy it names; without a path, the
// quick-start defaults (loadQuickstart).
func Load(path string) (*Loaded, error) {
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
		// log show a change to it. A read failure is reported when hooks are Loaded.
		if data, err := os.ReadFile(cfg.Hooks.File); err == nil {
			sum := sha256.Sum256(append([]byte(cfg.Hash), data...))
			cfg.Hash = hex.EncodeToString(sum[:])
		}
	}
	return &Loaded{Cfg: cfg, Policy: cfg.Rules}, nil
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
