package deploy_test

import (
	"path"
	"slices"
	"strings"
	"testing"
)

// TestSystemdNodeUnits: egressd-node.service runs the documented node config,
// whose state, specs and API socket are where the unit's directories are (the
// socket one level down, in a directory egressd makes 0700), with one
// capability, CAP_SYS_ADMIN for setns, in the host's user namespace; and
// egressd-netns-node@.service registers its sandbox with that node: the same
// sandboxes directory and config, after egressd-node.service.
func TestSystemdNodeUnits(t *testing.T) {
	unit, exec, install, cfg := unitConfig(t, "egressd-node.service")
	cfgPath := exec[slices.Index(exec, "--config")+1]
	if !cfg.Node.Enabled() {
		t.Fatalf("%s has no node section", install)
	}
	if want := "/var/lib/" + unit["StateDirectory"][0]; cfg.StateDir != want {
		t.Errorf("state_dir %s, want %s", cfg.StateDir, want)
	}
	if want := "/etc/" + unit["ConfigurationDirectory"][0]; !strings.HasPrefix(cfg.Node.SandboxesDir, want+"/") {
		t.Errorf("node.sandboxes_dir %s: want it under ConfigurationDirectory %s", cfg.Node.SandboxesDir, want)
	}
	if want := "/run/" + unit["RuntimeDirectory"][0]; path.Dir(path.Dir(cfg.Node.APISocket)) != want {
		t.Errorf("node.api_socket %s: want it in a directory of its own in RuntimeDirectory %s (egressd makes it 0700)", cfg.Node.APISocket, want)
	}
	for key, want := range map[string]string{
		"CapabilityBoundingSet": "CAP_SYS_ADMIN",
		"AmbientCapabilities":   "CAP_SYS_ADMIN",
		"RestrictNamespaces":    "net",
		"RuntimeDirectoryMode":  "0700",
		"NoNewPrivileges":       "yes",
		"DynamicUser":           "yes",
		"User":                  "egressd",
		"Type":                  "notify",
		"KillMode":              "mixed",
		"ProtectSystem":         "strict",
	} {
		if got := unit[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	// A user namespace of the service's own would make its CAP_SYS_ADMIN
	// worthless over the sandboxes' network namespaces, which the host's owns.
	if v := unit["PrivateUsers"]; len(v) != 0 && v[0] != "no" {
		t.Errorf("PrivateUsers=%v: setns into a sandbox's namespace needs the host's user namespace", v)
	}
	if !slices.Contains(unit["SystemCallFilter"], "setns") {
		t.Errorf("SystemCallFilter %q: setns must be allowed", unit["SystemCallFilter"])
	}

	netns := parseUnit(t, readRepoFile(t, "systemd/egressd-netns-node@.service"))
	if got := netns["ExecStart"]; len(got) != 1 || !strings.HasSuffix(got[0], "egressd-netns up %i --node") {
		t.Errorf("egressd-netns-node@ ExecStart=%q, want egressd-netns up %%i --node", got)
	}
	if got := netns["ExecStop"]; len(got) != 1 || !strings.HasSuffix(got[0], "egressd-netns down %i --node") {
		t.Errorf("egressd-netns-node@ ExecStop=%q, want egressd-netns down %%i --node", got)
	}
	if !slices.Contains(strings.Fields(strings.Join(netns["After"], " ")), "egressd-node.service") {
		t.Errorf("egressd-netns-node@ After=%q: up waits for egressd to listen inside the namespace", netns["After"])
	}
	env := map[string]string{}
	for _, e := range netns["Environment"] {
		k, v, _ := strings.Cut(e, "=")
		env[k] = v
	}
	for k, want := range map[string]string{"EGRESSD_NODE_SANDBOXES_DIR": cfg.Node.SandboxesDir, "EGRESSD_NODE_CONFIG": cfgPath, "EGRESSD_BIN": exec[0]} {
		if env[k] != want {
			t.Errorf("egressd-netns-node@ %s=%q, want %q", k, env[k], want)
		}
		if d := scriptDefault(t, k); d != want && k != "EGRESSD_BIN" { // the script's finds egressd on PATH
			t.Errorf("egressd-netns's default %s %q, want %q, as the units", k, d, want)
		}
	}
}
