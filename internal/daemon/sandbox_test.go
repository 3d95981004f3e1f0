package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// Placeholders are derived per sandbox: two sandboxes of one node naming the same
// credential get different placeholders, so neither can use the other's; a sidecar's
// stay what they were (derived for its environment alone).
func TestPlaceholdersPerSandbox(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"node.yaml":  "version: 1\nnode: {api_socket: node.sock}\ncredentials: {file: creds.json}\nstate_dir: state\n",
		"side.yaml":  "version: 1\nlisteners: [{name: s, address: \"127.0.0.1:0\"}]\npolicy: {file: env.json}\ncredentials: {file: creds.json}\nstate_dir: state\n",
		"env.json":   `{"network": {"allowlist": []}, "env": {"TOKEN": {"credential": "tok"}}}`,
		"creds.json": `{"tok": {"type": "environment_variable", "value": "v", "trusted_domains": ["x.test"]}}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	node, err := Load(filepath.Join(dir, "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec := []byte(`{"listeners": [{"name": "s", "address": "127.0.0.1:0"}], "environment": ` + files["env.json"] + `}`)
	placeholder := func(l *Loaded) string {
		t.Helper()
		r, err := Placeholders(l, &liveStore{})
		if err != nil || r == nil {
			t.Fatalf("Placeholders: %v", err)
		}
		return r.Env()["TOKEN"]
	}
	got := map[string]string{}
	for _, id := range []string{"sbx-a", "sbx-b"} {
		l, problems := LoadSandbox(node, id, spec, dir)
		if l == nil {
			t.Fatalf("%s: %v", id, problems)
		}
		got[id] = placeholder(l)
	}
	side, err := Load(filepath.Join(dir, "side.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got["sidecar"] = placeholder(side)
	if got["sbx-a"] == got["sbx-b"] || got["sbx-a"] == got["sidecar"] || got["sbx-b"] == got["sidecar"] {
		t.Errorf("placeholders %v: want one per sandbox, apart from the sidecar's", got)
	}
}
