package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// check --sandbox validates a spec file against a node's config, with the spec's
// paths and lines, and says ok for a good one.
func TestCheckSandbox(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"node.yaml":        "version: 1\nnode: {api_socket: node.sock}\ncredentials: {backend: file, file: credentials.json}\n",
		"credentials.json": "{}",
		"sbx-1.json": `{"listeners": [{"name": "sandbox", "address": "127.0.0.1:0"}],
 "environment": {"network": {"allowlist": [{"domain": "api.example.com"}]}}}`,
		"Bad.yaml": "listeners:\n  - {name: sandbox, address: \"127.0.0.1\"}\nenvironment: {network: {allowlist: [{domain: \"a..b\"}]}}\nlimts: {}\n",
	})
	node := filepath.Join(dir, "node.yaml")
	res := egressd(t, "check", "--config", node, "--sandbox", filepath.Join(dir, "sbx-1.json"))
	if res.code != 0 || strings.TrimSpace(res.stdout) != "ok" {
		t.Errorf("a good spec: exit %d\n%s", res.code, res)
	}
	res = egressd(t, "check", "--config", node, "--sandbox", filepath.Join(dir, "Bad.yaml"))
	for _, want := range []string{`error: id: invalid sandbox ID "Bad"`, `error: listeners[0].address: "127.0.0.1" has no port`,
		`error: environment.network.allowlist[0].domain:`, `error: limts: unknown key; did you mean "limits"?`} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("no %q\n%s", want, res)
		}
	}
	if res.code != 1 {
		t.Errorf("a bad spec: exit %d, want 1", res.code)
	}
}
