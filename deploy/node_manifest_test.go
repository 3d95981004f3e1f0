package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/config"
)

const nodeManifest = "kubernetes/node/egressd-node.yaml"

// nodeObject is what TestNodeManifest reads of the node manifest's objects.
type nodeObject struct {
	Kind string            `yaml:"kind"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		Ingress []struct {
			Ports []struct {
				Port int `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

// TestNodeManifest checks what matters of the node DaemonSet: nothing of the
// node's but the netns files and the API socket's directory, the one capability
// setns needs, the API socket where egressd makes its directory 0700, resources,
// and a config egressd parses without a warning, scoping credentials per sandbox.
func TestNodeManifest(t *testing.T) {
	objs := map[string]nodeObject{}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(readRepoFile(t, nodeManifest))))
	for {
		var o nodeObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		objs[o.Kind] = o
	}
	ds, ok := objs["DaemonSet"]
	if !ok {
		t.Fatal("no DaemonSet")
	}
	pod := ds.Spec.Template.Spec
	if pod.HostPID || pod.HostNetwork || pod.HostIPC || (pod.HostUsers != nil && !*pod.HostUsers) {
		t.Errorf("hostPID %v hostNetwork %v hostIPC %v hostUsers %v: want the node's PIDs, network and IPC unshared, and the node's user namespace (SYS_ADMIN in a pod's own is worthless over other pods' netns)",
			pod.HostPID, pod.HostNetwork, pod.HostIPC, pod.HostUsers)
	}
	if !isFalse(pod.AutomountServiceAccountToken) {
		t.Error("automountServiceAccountToken: want false (egressd calls no Kubernetes API)")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want egressd alone", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []string{"SYS_ADMIN"}) {
		t.Errorf("runAsUser %v, capabilities %+v: want uid 0 with every capability dropped but SYS_ADMIN (setns; a non-root container gets no effective capability)",
			deref(sc.RunAsUser), sc.Capabilities)
	}
	if isTrue(sc.Privileged) || !isFalse(sc.AllowPrivilegeEscalation) || !isTrue(sc.ReadOnlyRootFilesystem) || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("securityContext %+v: want unprivileged, no escalation, read-only root, RuntimeDefault seccomp", sc)
	}
	for _, k := range []string{"cpu", "memory"} {
		if c.Resources.Requests[k] == "" {
			t.Errorf("no %s request", k)
		}
	}
	if c.Resources.Limits["memory"] == "" || c.Resources.Limits["cpu"] != "" {
		t.Errorf("limits %v: want a memory limit (limits.memory is a quarter of it) and no CPU limit (throttling delays every sandbox's hook calls)", c.Resources.Limits)
	}
	hostPaths := map[string]string{} // mount path -> host path
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.HostPath == nil {
				continue
			}
			hostPaths[m.MountPath] = v.HostPath.Path
			switch v.HostPath.Path {
			case "/var/run/netns":
				if !m.ReadOnly || m.MountPropagation != "HostToContainer" {
					t.Errorf("netns mount %+v: want read-only, HostToContainer (namespaces made after egressd started)", m)
				}
			case "/run/egressd":
			default:
				t.Errorf("hostPath %s: want /var/run/netns and the API socket's directory only", v.HostPath.Path)
			}
		}
	}

	cfg := nodeConfig(t, objs["ConfigMap"].Data, c)
	sock := cfg.Node.APISocket
	if hostPaths[path.Dir(path.Dir(sock))] != "/run/egressd" {
		t.Errorf("node.api_socket %s: want it in a directory of its own under the /run/egressd hostPath mount (egressd makes that directory 0700; the hostPath root is the kubelet's 0755), mounts %v", sock, hostPaths)
	}
	if !strings.Contains(cfg.Credentials.Vault.KVPrefix, config.SandboxPlaceholder) {
		t.Errorf("kv_prefix %s: want %s in it, so each sandbox resolves its own credentials", cfg.Credentials.Vault.KVPrefix, config.SandboxPlaceholder)
	}
	if cfg.Admin.Address.IsValid() || cfg.Admin.Socket == "" {
		t.Errorf("admin address %s: want a Unix socket, which no pod can reach", cfg.Admin.Address)
	}
	np := objs["NetworkPolicy"]
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port != 14090 {
		t.Errorf("NetworkPolicy ingress %+v: want the health port alone", np.Spec.Ingress)
	}
}

// nodeConfig parses the config the container's --config names, from the
// ConfigMap, and wants no warning.
func nodeConfig(t *testing.T, data map[string]string, c container) *config.Config {
	t.Helper()
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("args %v lack --config", c.Args)
	}
	text, ok := data[path.Base(c.Args[i+1])]
	if !ok {
		t.Fatalf("the ConfigMap has no %s", path.Base(c.Args[i+1]))
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VAULT_ADDR", "")
	cfg, err := config.Parse([]byte(text), dir)
	if err != nil {
		t.Fatalf("node.yaml: %v", err)
	}
	for _, p := range cfg.Warnings {
		t.Errorf("node.yaml warns: %v", p)
	}
	return cfg
}
