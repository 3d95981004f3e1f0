package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

const testNode = `version: 1
environment: env_node
node:
  api_socket: /run/egressd/node.sock
credentials:
  backend: file
  file: creds.json
`

func parseNode(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(yaml), "/etc/egressd")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A node needs neither listeners nor a policy of its own: its own listeners, if
// any, then refuse everything.
func TestNodeConfig(t *testing.T) {
	cfg := parseNode(t, testNode)
	if !cfg.Node.Enabled() || cfg.Node.MaxSandboxes != DefaultMaxSandboxes || cfg.Node.APISocket != "/run/egressd/node.sock" {
		t.Errorf("node = %+v", cfg.Node)
	}
	if cfg.Rules == nil || !cfg.Rules.Disabled {
		t.Errorf("a node without a policy: rules %+v, want disabled", cfg.Rules)
	}
	_, err := Parse([]byte("version: 1\nnode: {}\ncredentials: {file: c.json}\n"), "")
	wantProblems(t, err, "node: set node.sandboxes_dir, node.api_socket or both")
	_, err = Parse([]byte("version: 1\nnode: {api_socket: s, max_sandboxes: 0}\ncredentials: {file: c.json}\n"), "")
	wantProblems(t, err, "node.max_sandboxes: must be positive")
	_, err = Parse([]byte("version: 1\ncredentials: {file: c.json}\n"), "")
	wantProblems(t, err, "listeners: at least one listener is required", "policy: required")
}

func wantProblems(t *testing.T, err error, want ...string) {
	t.Helper()
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("err = %v, want a *ValidationError", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("problems lack %q:\n%v", w, err)
		}
	}
}

func TestSandboxSpec(t *testing.T) {
	node := parseNode(t, testNode)
	spec := `{"netns": "/var/run/netns/sbx-1",
 "listeners": [{"name": "transparent", "address": "127.0.0.1:15002", "mode": "transparent"}],
 "dns": {"listen": "127.0.0.1:15053"},
 "environment": {"network": {"allowlist": [{"domain": "api.example.com", "credential": "api"}]}},
 "hooks": {"file": "hooks.json"},
 "credentials": {"file": "sbx-1-creds.json"},
 "limits": {"max_connections": 256}}`
	sb, err := ParseSandbox(node, "sbx-1", []byte(spec), "/etc/egressd/sandboxes.d")
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Config
	switch {
	case sb.Netns != "/var/run/netns/sbx-1":
		t.Errorf("netns %q", sb.Netns)
	case len(c.Listeners) != 1 || c.Listeners[0].Redirect != RedirectLocal:
		t.Errorf("listeners %+v: a netns listener is redirect: local", c.Listeners)
	case c.DNS.Listen != "127.0.0.1:15053" || c.Limits.MaxConnections != 256 || c.Limits.Dial != DefaultDial:
		t.Errorf("dns %+v limits %+v", c.DNS, c.Limits)
	case c.Credentials.File != "/etc/egressd/sandboxes.d/sbx-1-creds.json" || c.Hooks.File != "/etc/egressd/sandboxes.d/hooks.json":
		t.Errorf("paths: credentials %q hooks %q: the spec's resolve against its directory", c.Credentials.File, c.Hooks.File)
	case c.Rules == nil || len(c.Rules.Entries) != 1 || c.Environment != "env_node":
		t.Errorf("rules %+v env %q", c.Rules, c.Environment)
	case len(c.Warnings) != 0:
		t.Errorf("warnings %v", c.Warnings)
	}
}

// Every problem of a spec is reported at once, each with its path and line, and
// the node's own sections never appear among them.
func TestSandboxSpecProblems(t *testing.T) {
	node := parseNode(t, testNode)
	spec := `netns: relative/path
listeners:
  - {name: t, address: "127.0.0.1", mode: transparent}
environment:
  network:
    allowlist:
      - {domain: "a..b"}
limits: {max_connections: -1}
credentials: {kv_prefix: "x/{sandbox}"}
hooks: {signing_key: {file: k.pem}}
tls: {}
`
	_, err := ParseSandbox(node, "Bad_ID", []byte(spec), "")
	wantProblems(t, err,
		`id: invalid sandbox ID "Bad_ID"`,
		`netns: "relative/path" is not a clean absolute path`,
		`listeners[0].address: "127.0.0.1" has no port`,
		"environment.network.allowlist[0].domain:",
		"limits.max_connections: must be positive",
		"credentials.kv_prefix: the node's credentials.backend is file",
		"hooks.signing_key:",
		`tls: unknown key`)
	if strings.Contains(err.Error(), "policy") || strings.Contains(err.Error(), "admin") {
		t.Errorf("the node's own sections leak into the spec's problems:\n%v", err)
	}
	if !strings.Contains(err.Error(), "line 3") {
		t.Errorf("no line numbers:\n%v", err)
	}
	_, err = ParseSandbox(node, "a", []byte(`{"listeners": []}`), "")
	wantProblems(t, err, "listeners: at least one listener is required", "environment: required")
}

// {sandbox} in the node's kv_prefix scopes each sandbox's credential IDs.
func TestSandboxKVPrefix(t *testing.T) {
	t.Setenv("VAULT_ADDR", "")
	node := parseNode(t, `version: 1
node: {sandboxes_dir: sandboxes.d}
credentials:
  backend: vault
  vault: {address: "http://127.0.0.1:8200", kv_prefix: "egressd/{sandbox}", auth: {token_file: t}}
`)
	if node.Node.SandboxesDir != filepath.Join("/etc/egressd", "sandboxes.d") {
		t.Errorf("sandboxes_dir %q", node.Node.SandboxesDir)
	}
	spec := `{"listeners": [{"name": "p", "address": "127.0.0.1:0"}], "environment": {"network": {"allowlist": []}}}`
	sb, err := ParseSandbox(node, "sbx-9", []byte(spec), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.Config.Credentials.Vault.KVPrefix; got != "egressd/sbx-9" {
		t.Errorf("kv_prefix %q, want egressd/sbx-9", got)
	}
	own := `{"listeners": [{"name": "p", "address": "127.0.0.1:0"}], "environment": {"network": {"allowlist": []}},
  "credentials": {"kv_prefix": "teams/{sandbox}/keys"}}`
	if sb, err = ParseSandbox(node, "sbx-9", []byte(own), ""); err != nil || sb.Config.Credentials.Vault.KVPrefix != "teams/sbx-9/keys" {
		t.Errorf("own prefix: %v %+v", err, sb)
	}
}

// A role: hooks listener inside the sandbox's netns must name the runtime's UID:
// every process of the sandbox reaches it. peer_uids needs a loopback listener.
func TestSandboxHooksListenerPeers(t *testing.T) {
	node := parseNode(t, testNode)
	spec := func(hooks string) string {
		return `netns: /run/netns/a
listeners:
  - {name: t, address: "127.0.0.1:15002", mode: transparent}
  - ` + hooks + `
environment: {network: {allowlist: [{domain: a.test}]}}
`
	}
	_, err := ParseSandbox(node, "a", []byte(spec(`{name: h, address: "127.0.0.1:15003", role: hooks}`)), "")
	wantProblems(t, err, "listeners[1].peer_uids: a role: hooks listener inside the sandbox's netns is reachable by every process")
	if _, err := ParseSandbox(node, "a", []byte(spec(`{name: h, address: "127.0.0.1:15003", role: hooks, peer_uids: [1001]}`)), ""); err != nil {
		t.Errorf("with peer_uids: %v", err)
	}
	_, err = ParseSandbox(node, "a", []byte(spec(`{name: h, address: "10.0.0.1:15003", role: hooks, peer_uids: [1001]}`)), "")
	wantProblems(t, err, "listeners[1].peer_uids: only a loopback listener's peers")
	_, err = ParseSandbox(node, "a", []byte(spec(`{name: h, address: "127.0.0.1:15003", role: hooks, peer_uids: [-1]}`)), "")
	wantProblems(t, err, "listeners[1].peer_uids[0]: expected an integer")
}
