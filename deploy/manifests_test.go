package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/config"
)

// The manifests are checked against each other and against egressd's own
// config parser: a port, path or UID that one file changes and another
// does not fails here, not in a cluster.

// egressdUID is the UID egressd runs as everywhere and the Kubernetes init
// container excludes from the redirect.
const egressdUID = 1555

// Istio's sidecar owns these in every injected pod, which shares one network
// namespace and one set of iptables rules with egressd: istio-proxy's uid
// (istio-init's rules let it, and so anything running as it, bypass Envoy) and
// the ports 15000-15090 (Envoy admin 15000, outbound 15001, inbound 15006,
// HBONE 15008, merged metrics 15020, health 15021, DNS 15053, Prometheus
// 15090, and the others between). docs/kubernetes.md.
const (
	istioUID                    = 1337
	istioPortLow, istioPortHigh = 15000, 15090
	egressdMemoryLimit          = "256Mi"
)

func istioPort(p int) bool { return p >= istioPortLow && p <= istioPortHigh }

// drainMargin is how much longer than limits.drain the pod's grace period must be:
// the kubelet stops the agent's containers first and the sidecar after them, and
// egressd needs a moment past its drain to close what is left and flush its log.
const drainMargin = 5 * time.Second

// Kubernetes objects, as far as the checks need them.
type (
	object struct {
		Kind     string            `yaml:"kind"`
		Metadata metadata          `yaml:"metadata"`
		Data     map[string]string `yaml:"data"`
		Spec     struct {
			podSpec  `yaml:",inline"` // a Pod's
			Template *struct {
				Metadata metadata `yaml:"metadata"`
				Spec     podSpec  `yaml:"spec"`
			} `yaml:"template"` // a Deployment's
			PodSelector *struct{} `yaml:"podSelector"` // a NetworkPolicy's
			PolicyTypes []string  `yaml:"policyTypes"`
			Ingress     []struct {
				From  []any `yaml:"from"`
				Ports []struct {
					Port     any    `yaml:"port"`
					Protocol string `yaml:"protocol"`
				} `yaml:"ports"`
			} `yaml:"ingress"`
			PodMetricsEndpoints []struct {
				Port       string `yaml:"port"`
				TargetPort any    `yaml:"targetPort"`
				Path       string `yaml:"path"`
			} `yaml:"podMetricsEndpoints"` // a PodMonitor's
			Groups []struct {
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"` // a PrometheusRule's
		} `yaml:"spec"`
	}
	metadata struct {
		Name        string            `yaml:"name"`
		Annotations map[string]string `yaml:"annotations"`
	}
	podSpec struct {
		HostPID                       bool        `yaml:"hostPID"`
		HostNetwork                   bool        `yaml:"hostNetwork"`
		HostIPC                       bool        `yaml:"hostIPC"`
		HostUsers                     *bool       `yaml:"hostUsers"`
		ServiceAccountName            string      `yaml:"serviceAccountName"`
		TerminationGracePeriodSeconds *int        `yaml:"terminationGracePeriodSeconds"`
		AutomountServiceAccountToken  *bool       `yaml:"automountServiceAccountToken"`
		ShareProcessNamespace         bool        `yaml:"shareProcessNamespace"`
		InitContainers                []container `yaml:"initContainers"`
		Containers                    []container `yaml:"containers"`
		Volumes                       []volume    `yaml:"volumes"`
	}
	container struct {
		Name          string   `yaml:"name"`
		Image         string   `yaml:"image"`
		Command       []string `yaml:"command"`
		Args          []string `yaml:"args"`
		RestartPolicy string   `yaml:"restartPolicy"`
		Env           []struct{ Name, Value string }
		Resources     struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		Ports           []containerPort `yaml:"ports"`
		StartupProbe    *probe          `yaml:"startupProbe"`
		ReadinessProbe  *probe          `yaml:"readinessProbe"`
		LivenessProbe   *probe          `yaml:"livenessProbe"`
		SecurityContext securityContext `yaml:"securityContext"`
		VolumeMounts    []volumeMount   `yaml:"volumeMounts"`
	}
	volumeMount struct {
		Name             string `yaml:"name"`
		MountPath        string `yaml:"mountPath"`
		ReadOnly         bool   `yaml:"readOnly"`
		MountPropagation string `yaml:"mountPropagation"`
	}
	containerPort struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	}
	probe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port int    `yaml:"port"`
		} `yaml:"httpGet"`
	}
	securityContext struct {
		RunAsUser                *int  `yaml:"runAsUser"`
		Privileged               *bool `yaml:"privileged"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Add  []string `yaml:"add"`
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	}
	volume struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
			Type string `yaml:"type"`
		} `yaml:"hostPath"`
		ConfigMap *struct{ Name string } `yaml:"configMap"`
		Secret    *struct {
			SecretName string `yaml:"secretName"`
			Items      []struct {
				Key string `yaml:"key"`
			} `yaml:"items"`
		} `yaml:"secret"`
		EmptyDir  *struct{} `yaml:"emptyDir"`
		Projected *struct {
			Sources []struct {
				ServiceAccountToken *struct {
					Audience string `yaml:"audience"`
					Path     string `yaml:"path"`
				} `yaml:"serviceAccountToken"`
			} `yaml:"sources"`
		} `yaml:"projected"`
	}
)

// workload holds the parts of the sidecar manifest the checks compare.
type workload struct {
	configMaps     map[string]map[string]string
	pod            podSpec
	podAnnotations map[string]string
	others         []object // NetworkPolicy, PodMonitor, PrometheusRule
}

func TestKubernetesManifests(t *testing.T) {
	checkWorkload(t, loadKubernetes(t))
}

// checkWorkload checks one pod with egressd in it: the plain manifest's or the
// Helm chart's rendering.
func checkWorkload(t *testing.T, w *workload) {
	egressd := w.container(t, "egressd")
	initC := w.container(t, "egressd-init")

	cfgPath, cfg, admin := w.egressdConfig(t, egressd)
	t.Logf("egressd in the pod reads %s", cfgPath)
	// A shipped config that warns about what its README says does not apply teaches
	// operators to ignore warnings: the sidecar's config says why instead
	// (redirect: local).
	for _, p := range cfg.Warnings {
		t.Errorf("config warning: %v", p)
	}

	t.Run("admin split", func(t *testing.T) {
		checkAdminSplit(t, w, admin, egressd, initC)
	})

	t.Run("istio", func(t *testing.T) {
		checkIstioClear(t, w, cfg, admin)
	})

	t.Run("resources", func(t *testing.T) {
		checkResources(t, w)
	})

	t.Run("ports", func(t *testing.T) {
		tproxy := transparentPort(t, cfg)
		for _, l := range cfg.Listeners {
			if l.Mode == config.ModeTransparent && !l.Address.Addr().IsLoopback() {
				t.Errorf("listener %s on %s: REDIRECT in a pod's OUTPUT chain delivers to 127.0.0.1 or ::1", l.Name, l.Address)
			}
		}
		if !hasListener(cfg, "127.0.0.1") || !hasListener(cfg, "::1") {
			t.Errorf("want transparent listeners on 127.0.0.1 and ::1 (IPv4 and IPv6 REDIRECT targets)")
		}
		dns := netip.MustParseAddrPort(cfg.DNS.Listen)
		if !dns.Addr().IsLoopback() {
			t.Errorf("dns.listen %s: REDIRECT delivers to loopback", dns)
		}
		wantPort(t, egressd, "transparent", "TCP", tproxy)
		wantPort(t, egressd, "dns-udp", "UDP", int(dns.Port()))
		wantPort(t, egressd, "dns-tcp", "TCP", int(dns.Port()))
		wantEnv(t, initC, "EGRESSD_TPROXY_PORT", strconv.Itoa(tproxy))
		wantEnv(t, initC, "EGRESSD_DNS_PORT", strconv.Itoa(int(dns.Port())))
		wantEnv(t, initC, "EGRESSD_REDIRECT_PORTS", joinPorts(cfg.Network.DefaultPorts))
		// Only egressd may answer from its ports: the init rules drop what other
		// uids send from the ports they know of, so they must know of each.
		guarded := strings.Split(initOwnPorts(initC), ",")
		for _, l := range cfg.Listeners {
			if !slices.Contains(guarded, strconv.Itoa(int(l.Address.Port()))) {
				t.Errorf("listener %s on %s: its port is not among the init container's (add it to EGRESSD_OTHER_PORTS), so a squatter could answer from it", l.Name, l.Address)
			}
		}
	})

	t.Run("uids", func(t *testing.T) {
		wantEnv(t, initC, "EGRESSD_UID", strconv.Itoa(egressdUID))
		if u := egressd.SecurityContext.RunAsUser; u == nil || *u != egressdUID {
			t.Errorf("egressd runAsUser %v, want %d (the UID the init container excludes)", deref(u), egressdUID)
		}
		if u := dockerfileUID(t); u != egressdUID {
			t.Errorf("Dockerfile USER %d, want %d", u, egressdUID)
		}
		for _, c := range w.pod.Containers {
			if u := c.SecurityContext.RunAsUser; u == nil || *u == egressdUID || *u == istioUID || *u == 0 {
				t.Errorf("container %s runAsUser %v: must be set, not root, not %d nor Istio's %d (those UIDs bypass the redirect)",
					c.Name, deref(u), egressdUID, istioUID)
			}
		}
	})

	t.Run("hooks listener", func(t *testing.T) {
		checkHooksListener(t, w, cfg, initC, egressd)
	})

	t.Run("drain", func(t *testing.T) {
		g := w.pod.TerminationGracePeriodSeconds
		if g == nil {
			t.Fatalf("terminationGracePeriodSeconds unset (Kubernetes' 30s): set it to more than limits.drain (%s) + %s", cfg.Limits.Drain, drainMargin)
		}
		if grace := time.Duration(*g) * time.Second; grace < cfg.Limits.Drain+drainMargin {
			t.Errorf("terminationGracePeriodSeconds %d: the kubelet kills egressd before limits.drain (%s) + %s has passed",
				*g, cfg.Limits.Drain, drainMargin)
		}
	})

	t.Run("security", func(t *testing.T) {
		sc := egressd.SecurityContext
		if !isTrue(sc.RunAsNonRoot) || !isTrue(sc.ReadOnlyRootFilesystem) || isTrue(sc.AllowPrivilegeEscalation) ||
			!slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			t.Errorf("egressd securityContext %+v: want non-root, read-only root, no escalation, all capabilities dropped", sc)
		}
		if add := initC.SecurityContext.Capabilities.Add; !slices.Contains(add, "NET_ADMIN") || !slices.Contains(add, "NET_RAW") {
			t.Errorf("egressd-init capabilities %v: needs NET_ADMIN and NET_RAW", add)
		}
		for _, c := range w.pod.Containers {
			sc := c.SecurityContext
			if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) != 0 || isTrue(sc.AllowPrivilegeEscalation) {
				t.Errorf("container %s: drop ALL capabilities and add none (with NET_ADMIN it could undo the rules)", c.Name)
			}
		}
		if egressd.RestartPolicy != "Always" || !slices.ContainsFunc(w.pod.InitContainers, func(c container) bool { return c.Name == "egressd" }) {
			t.Errorf("egressd should be a native sidecar (an init container with restartPolicy Always), so it is ready before the agent starts")
		}
		if i, j := w.initIndex("egressd-init"), w.initIndex("egressd"); i < 0 || j < 0 || i > j {
			t.Errorf("egressd-init must run before egressd")
		}
		if w.pod.ShareProcessNamespace {
			t.Errorf("shareProcessNamespace would let the agent read egressd's files through /proc")
		}
	})

	t.Run("paths", func(t *testing.T) {
		// The read-only root filesystem leaves state_dir and the CA to mounts.
		if v := w.mountVolume(egressd, cfg.StateDir); v == nil || v.EmptyDir == nil {
			t.Errorf("state_dir %s is not on an emptyDir mount", cfg.StateDir)
		}
		for _, f := range []string{cfg.TLS.CACert, cfg.TLS.CAKey} {
			if f != "" && w.mountVolume(egressd, path.Dir(f)) == nil {
				t.Errorf("%s is not on a mount of the egressd container", f)
			}
		}
	})

	t.Run("credentials", func(t *testing.T) {
		checkCredentialMounts(t, w, cfg, egressd)
		if !isFalse(w.pod.AutomountServiceAccountToken) {
			t.Errorf("automountServiceAccountToken must be false: only egressd gets a token")
		}
		// The sandbox's containers get no token and, of a Secret, only a
		// certificate (egressd's CA, to trust it), never a key.
		for _, c := range w.pod.Containers {
			for _, m := range c.VolumeMounts {
				vol := w.volume(m.Name)
				if vol == nil {
					t.Errorf("container %s mounts undefined volume %s", c.Name, m.Name)
					continue
				}
				if vol.Projected != nil {
					t.Errorf("container %s mounts projected volume %s (a token)", c.Name, m.Name)
				}
				if vol.Secret != nil && (len(vol.Secret.Items) == 0 || slices.ContainsFunc(vol.Secret.Items, func(it struct {
					Key string `yaml:"key"`
				}) bool {
					return it.Key != "tls.crt"
				})) {
					t.Errorf("container %s mounts Secret volume %s with more than tls.crt", c.Name, m.Name)
				}
			}
		}
	})

	t.Run("agent trust", func(t *testing.T) {
		checkAgentTrust(t, w, cfg, egressd)
	})

	t.Run("init script", func(t *testing.T) {
		script := readRepoFile(t, "kubernetes/egressd-init.sh")
		for _, e := range initC.Env {
			if !strings.Contains(script, e.Name) {
				t.Errorf("egressd-init env %s is not read by egressd-init.sh", e.Name)
			}
		}
		df := readRepoFile(t, "docker/Dockerfile.init")
		if !strings.Contains(df, "COPY deploy/kubernetes/egressd-init.sh /usr/local/bin/egressd-init") ||
			!strings.Contains(df, `ENTRYPOINT ["/usr/local/bin/egressd-init"]`) {
			t.Errorf("Dockerfile.init does not install and run egressd-init.sh")
		}
		if !strings.Contains(initC.Image, "egressd-init") || len(initC.Command) != 0 {
			t.Errorf("egressd-init runs %s with command %v; want the egressd-init image's entrypoint", initC.Image, initC.Command)
		}
	})

	t.Run("entrypoint", func(t *testing.T) {
		// command replaces the ENTRYPOINT and args the CMD; the pod's command
		// line must be the image's.
		got := append(slices.Clone(egressd.Command), egressd.Args...)
		if want := dockerfileEntrypoint(t); !slices.Equal(got, want) {
			t.Errorf("egressd command+args %q, Dockerfile ENTRYPOINT %q", got, want)
		}
	})
}

// checkHooksListener: a hooks listener (its traffic is hook traffic, which egressd
// signs) must be on loopback, where the init rules' -o lo owner match applies, and
// on the port the init container's EGRESSD_HOOKS_PORT opens to EGRESSD_RUNTIME_UID
// only; that uid is neither root nor egressd's, exactly one container (the
// runtime) runs as it, and no other container shares it. Without a hooks listener
// EGRESSD_HOOKS_PORT must be unset.
func checkHooksListener(t *testing.T, w *workload, cfg *config.Config, initC, egressd container) {
	var hooks []config.Listener
	for _, l := range cfg.Listeners {
		if l.Role == config.RoleHooks {
			hooks = append(hooks, l)
		}
	}
	port, runtime := envValue(initC, "EGRESSD_HOOKS_PORT"), envValue(initC, "EGRESSD_RUNTIME_UID")
	if len(hooks) == 0 {
		if port != "" {
			t.Errorf("EGRESSD_HOOKS_PORT %s without a hooks listener", port)
		}
		return
	}
	if len(hooks) > 1 {
		t.Fatalf("%d hooks listeners; the init rules open one port", len(hooks))
	}
	l := hooks[0]
	if !l.Address.Addr().IsLoopback() {
		t.Errorf("hooks listener on %s: the init rules guard it on loopback only", l.Address)
	}
	wantEnv(t, initC, "EGRESSD_HOOKS_PORT", strconv.Itoa(int(l.Address.Port())))
	wantPort(t, egressd, "hooks", "TCP", int(l.Address.Port()))
	uid, err := strconv.Atoi(runtime)
	if err != nil || uid == 0 || uid == egressdUID {
		t.Fatalf("EGRESSD_RUNTIME_UID %q: want the agent runtime's own uid (not 0, not %d)", runtime, egressdUID)
	}
	var as []string
	for _, c := range w.pod.Containers {
		if u := c.SecurityContext.RunAsUser; u != nil && *u == uid {
			as = append(as, c.Name)
		}
	}
	if len(as) != 1 {
		t.Errorf("containers running as the runtime's uid %d: %v; want exactly the agent runtime's (the sandbox must not share it)", uid, as)
	}
}

func envValue(c container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// loadKubernetes decodes every document of every YAML file in kubernetes/.
func loadKubernetes(t *testing.T) *workload {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	var all []byte
	for _, f := range files {
		all = append(all, "\n---\n"+readRepoFile(t, f)...)
	}
	return loadWorkload(t, "deploy/kubernetes", all)
}

// loadWorkload decodes a stream of manifests holding exactly one pod (a Pod, or
// a Deployment's template).
func loadWorkload(t *testing.T, name string, stream []byte) *workload {
	t.Helper()
	w := &workload{configMaps: map[string]map[string]string{}}
	pods := 0
	dec := yaml.NewDecoder(bytes.NewReader(stream))
	for i := 0; ; i++ {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s document %d: %v", name, i, err)
		}
		switch o.Kind {
		case "ConfigMap":
			w.configMaps[o.Metadata.Name] = o.Data
		case "Pod":
			w.pod, w.podAnnotations = o.Spec.podSpec, o.Metadata.Annotations
			pods++
		case "Deployment":
			w.pod, w.podAnnotations = o.Spec.Template.Spec, o.Spec.Template.Metadata.Annotations
			pods++
		case "NetworkPolicy", "PodMonitor", "PrometheusRule":
			w.others = append(w.others, o)
		case "ServiceAccount", "Secret", "":
		default:
			t.Errorf("%s document %d: kind %s is not checked by this test; extend it", name, i, o.Kind)
		}
	}
	if pods != 1 {
		t.Fatalf("%d pods in %s, want 1", pods, name)
	}
	return w
}

// egressdConfig finds the file the egressd container's --config names,
// writes the ConfigMap that provides it (every key) to a directory, and
// parses it as egressd would.
func (w *workload) egressdConfig(t *testing.T, c container) (string, *config.Config, adminView) {
	t.Helper()
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("egressd args %v lack --config FILE", c.Args)
	}
	cfgPath := c.Args[i+1]
	v := w.mountVolume(c, path.Dir(cfgPath))
	if v == nil || v.ConfigMap == nil {
		t.Fatalf("--config %s: no ConfigMap is mounted at %s", cfgPath, path.Dir(cfgPath))
	}
	data, ok := w.configMaps[v.ConfigMap.Name]
	if !ok {
		t.Fatalf("ConfigMap %s is mounted but not defined in deploy/kubernetes", v.ConfigMap.Name)
	}
	if _, ok := data[path.Base(cfgPath)]; !ok {
		t.Fatalf("ConfigMap %s has no key %s", v.ConfigMap.Name, path.Base(cfgPath))
	}
	dir := t.TempDir()
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("VAULT_ADDR", "") // the config must name Vault itself
	text := data[path.Base(cfgPath)]
	admin := readAdmin(t, text)
	cfg, err := config.Parse([]byte(text), dir)
	if err != nil {
		t.Fatalf("%s from ConfigMap %s: %v", cfgPath, v.ConfigMap.Name, err)
	}
	// Paths under the mount resolve to dir; map them back to the pod's view.
	rebase := func(p string) string {
		if rel, ok := strings.CutPrefix(p, dir); ok {
			return path.Dir(cfgPath) + filepath.ToSlash(rel)
		}
		return p
	}
	cfg.StateDir, cfg.TLS.CACert, cfg.TLS.CAKey = rebase(cfg.StateDir), rebase(cfg.TLS.CACert), rebase(cfg.TLS.CAKey)
	a := &cfg.Credentials.Vault.Auth
	a.JWTFile, a.RoleIDFile, a.SecretIDFile, a.TokenFile = rebase(a.JWTFile), rebase(a.RoleIDFile), rebase(a.SecretIDFile), rebase(a.TokenFile)
	cfg.Credentials.File = rebase(cfg.Credentials.File)
	return cfgPath, cfg, admin
}

func (w *workload) container(t *testing.T, name string) container {
	t.Helper()
	for _, c := range append(slices.Clone(w.pod.InitContainers), w.pod.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s in the pod", name)
	return container{}
}

func (w *workload) initIndex(name string) int {
	return slices.IndexFunc(w.pod.InitContainers, func(c container) bool { return c.Name == name })
}

func (w *workload) volume(name string) *volume {
	for i := range w.pod.Volumes {
		if w.pod.Volumes[i].Name == name {
			return &w.pod.Volumes[i]
		}
	}
	return nil
}

// mountVolume returns the volume mounted exactly at dir in c.
func (w *workload) mountVolume(c container, dir string) *volume {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			return w.volume(m.Name)
		}
	}
	return nil
}

func TestDockerfile(t *testing.T) {
	df := readRepoFile(t, "docker/Dockerfile")
	stages := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(stages) < 2 || !strings.HasPrefix(stages[len(stages)-1][1], "gcr.io/distroless/static") {
		t.Errorf("want a multi-stage build ending on gcr.io/distroless/static, got %v", stages)
	}
	if !strings.Contains(df, "CGO_ENABLED=0 go build") {
		t.Error("the binary must be static: CGO_ENABLED=0")
	}
	want := []string{"/egressd", "run", "--config", "/etc/egressd/egressd.yaml"}
	if got := dockerfileEntrypoint(t); !slices.Equal(got, want) {
		t.Errorf("ENTRYPOINT %q, want %q", got, want)
	}
	expose := regexp.MustCompile(`(?m)^EXPOSE\s+(.*)$`).FindStringSubmatch(df)
	for _, p := range []string{"14000/tcp", "14002/tcp", "14053/tcp", "14053/udp", "14090/tcp"} {
		if expose == nil || !slices.Contains(strings.Fields(expose[1]), p) {
			t.Errorf("EXPOSE lacks %s", p)
		}
	}
}

func TestSystemdUnit(t *testing.T) {
	unit, _, install, cfg := unitConfig(t, "egressd.service")
	if want := "/var/lib/" + unit["StateDirectory"][0]; cfg.StateDir != want {
		t.Errorf("state_dir %s, want %s (StateDirectory=%s)", cfg.StateDir, want, unit["StateDirectory"][0])
	}
	if cfg.Credentials.Backend == config.BackendFile {
		name, _, _ := strings.Cut(strings.Join(unit["LoadCredential"], ""), ":")
		if want := "/run/credentials/egressd.service/" + name; name == "" || cfg.Credentials.File != want {
			t.Errorf("credentials.file %s: want the LoadCredential= path %s", cfg.Credentials.File, want)
		}
	}
	for key, want := range map[string]string{
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"DynamicUser":             "yes",
		"AmbientCapabilities":     "",
		"CapabilityBoundingSet":   "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"ExecReload":              "/bin/kill -HUP $MAINPID",
		// The supervising parent is the main process: it says when egressd is
		// ready, and it alone gets SIGTERM, which it passes to its worker.
		"Type":         "notify",
		"NotifyAccess": "main",
		"KillMode":     "mixed",
	} {
		if got := unit[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}

	// The example config is for a namespace made by egressd-netns with
	// EGRESSD_NETNS_INDEX=1 and the script's default ports.
	tproxy, dns := scriptDefault(t, "EGRESSD_TPROXY_PORT"), scriptDefault(t, "EGRESSD_DNS_PORT")
	if !hasListenerAt(cfg, "10.200.1.1:"+tproxy) || !hasListenerAt(cfg, "[fd00:200:0:1::1]:"+tproxy) {
		t.Errorf("%s: want transparent listeners on 10.200.1.1:%s and [fd00:200:0:1::1]:%s", install, tproxy, tproxy)
	}
	if cfg.DNS.Listen != "10.200.1.1:"+dns {
		t.Errorf("%s: dns.listen %s, want 10.200.1.1:%s", install, cfg.DNS.Listen, dns)
	}
}

// TestSystemdSocket: egressd.socket listens on exactly the sockets the systemd
// example config serves (egressd matches each to its listener by address and
// closes one it cannot match), and the service's user is the static one
// egressd.sysusers creates, which egressd-netns's default EGRESSD_UID names.
func TestSystemdSocket(t *testing.T) {
	sock := parseUnit(t, readRepoFile(t, "systemd/egressd.socket"))
	cfg := parseRepoConfig(t, "systemd/egressd.yaml")
	want := []string{"stream " + cfg.Admin.Address.String(), "stream " + cfg.DNS.Listen, "datagram " + cfg.DNS.Listen}
	for _, l := range cfg.Listeners {
		want = append(want, "stream "+l.Address.String())
	}
	var got []string
	for _, a := range sock["ListenStream"] {
		got = append(got, "stream "+a)
	}
	for _, a := range sock["ListenDatagram"] {
		got = append(got, "datagram "+a)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("egressd.socket listens on %q; egressd.yaml serves %q", got, want)
	}
	if v := sock["FreeBind"]; len(v) != 1 || v[0] != "yes" {
		t.Errorf("FreeBind=%q: the namespace's address exists only once egressd-netns@ has run", v)
	}
	unit := parseUnit(t, readRepoFile(t, "systemd/egressd.service"))
	user := regexp.MustCompile(`(?m)^u (\S+) `).FindStringSubmatch(readRepoFile(t, "systemd/egressd.sysusers"))
	if user == nil || unit["User"][0] != user[1] || scriptDefaultUser(t) != user[1] {
		t.Errorf("egressd.sysusers creates %v, egressd.service runs as %v, egressd-netns defaults EGRESSD_UID to %s: want one user",
			user, unit["User"], scriptDefaultUser(t))
	}
}

// unitConfig parses deploy/systemd/NAME, the config its ExecStart names (egressd
// run --config FILE), which the unit documents installing from a repository file,
// and that file: the unit, the egressd command, the file's name, the config.
func unitConfig(t *testing.T, name string) (map[string][]string, []string, string, *config.Config) {
	t.Helper()
	text := readRepoFile(t, "systemd/"+name)
	unit := parseUnit(t, text)
	exec := strings.Fields(unit["ExecStart"][0])
	i := slices.Index(exec, "--config")
	if i < 0 || i+1 >= len(exec) || exec[1] != "run" {
		t.Fatalf("ExecStart %q: want egressd run --config FILE", exec)
	}
	cfgPath := exec[i+1]
	install := regexp.MustCompile(`install .*deploy/systemd/(\S+) ` + regexp.QuoteMeta(cfgPath)).FindStringSubmatch(text)
	if install == nil {
		t.Fatalf("%s does not document what to install at %s", name, cfgPath)
	}
	return unit, exec, install[1], parseRepoConfig(t, "systemd/"+install[1])
}

// scriptDefaultUser is the user egressd-netns's EGRESSD_UID defaults to.
func scriptDefaultUser(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`EGRESSD_UID:-\$\(id -u (\S+) `).FindStringSubmatch(readRepoFile(t, script))
	if m == nil {
		t.Fatalf("%s: no default user for EGRESSD_UID", script)
	}
	return m[1]
}

// TestDefaultPortsAgree: the netns script, the init container's script and
// the Kubernetes config use one set of port numbers.
func TestDefaultPortsAgree(t *testing.T) {
	initScript := readRepoFile(t, "kubernetes/egressd-init.sh")
	for _, v := range []string{"EGRESSD_TPROXY_PORT", "EGRESSD_DNS_PORT", "EGRESSD_REDIRECT_PORTS"} {
		netnsDefault := scriptDefault(t, v)
		m := regexp.MustCompile(`\$\{` + v + `:-([^}]*)\}`).FindStringSubmatch(initScript)
		if m == nil || m[1] != netnsDefault {
			t.Errorf("%s: egressd-netns default %s, egressd-init.sh %v", v, netnsDefault, m)
		}
	}
}

// parseRepoConfig parses a config from the repository with the policy and
// credentials files it names taken from configs/.
func parseRepoConfig(t *testing.T, name string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"environment.json", "credentials.json"} {
		b, err := os.ReadFile(filepath.Join("..", "configs", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Parse([]byte(readRepoFile(t, name)), dir)
	if err != nil {
		t.Fatalf("deploy/%s: %v", name, err)
	}
	return cfg
}

// parseUnit reads a systemd unit's Key=Value lines (all sections).
func parseUnit(t *testing.T, text string) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("unit line %q is not Key=Value", line)
		}
		m[k] = append(m[k], v)
	}
	return m
}

// scriptDefault is the default the netns script gives variable v.
func scriptDefault(t *testing.T, v string) string {
	t.Helper()
	m := regexp.MustCompile(`\$\{` + v + `:-([^}]*)\}`).FindStringSubmatch(readRepoFile(t, script))
	if m == nil {
		t.Fatalf("%s has no default for %s", script, v)
	}
	return m[1]
}

func dockerfileUID(t *testing.T) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^USER\s+(\d+)`).FindAllStringSubmatch(readRepoFile(t, "docker/Dockerfile"), -1)
	if len(m) == 0 {
		t.Fatal("Dockerfile has no numeric USER")
	}
	uid, _ := strconv.Atoi(m[len(m)-1][1])
	return uid
}

func dockerfileEntrypoint(t *testing.T) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^ENTRYPOINT\s+(\[.*\])\s*$`).FindAllStringSubmatch(readRepoFile(t, "docker/Dockerfile"), -1)
	if len(m) == 0 {
		t.Fatal("Dockerfile has no exec-form ENTRYPOINT")
	}
	var args []string
	if err := yaml.Unmarshal([]byte(m[len(m)-1][1]), &args); err != nil { // a JSON array is YAML
		t.Fatal(err)
	}
	return args
}

func transparentPort(t *testing.T, cfg *config.Config) int {
	t.Helper()
	port := 0
	for _, l := range cfg.Listeners {
		if l.Mode != config.ModeTransparent {
			continue
		}
		if port != 0 && int(l.Address.Port()) != port {
			t.Errorf("transparent listeners on ports %d and %d; the REDIRECT has one target port", port, l.Address.Port())
		}
		port = int(l.Address.Port())
	}
	if port == 0 {
		t.Fatal("no transparent listener")
	}
	return port
}

func hasListener(cfg *config.Config, ip string) bool {
	return slices.ContainsFunc(cfg.Listeners, func(l config.Listener) bool {
		return l.Mode == config.ModeTransparent && l.Address.Addr() == netip.MustParseAddr(ip)
	})
}

func hasListenerAt(cfg *config.Config, addr string) bool {
	return slices.ContainsFunc(cfg.Listeners, func(l config.Listener) bool {
		return l.Mode == config.ModeTransparent && l.Address == netip.MustParseAddrPort(addr)
	})
}

func wantPort(t *testing.T, c container, name, proto string, port int) {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			if p.ContainerPort != port || p.Protocol != proto {
				t.Errorf("containerPort %s: %d/%s, want %d/%s", name, p.ContainerPort, p.Protocol, port, proto)
			}
			return
		}
	}
	t.Errorf("container %s has no port %s (%d/%s)", c.Name, name, port, proto)
}

func wantEnv(t *testing.T, c container, name, want string) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			if e.Value != want {
				t.Errorf("%s env %s=%q, want %q", c.Name, name, e.Value, want)
			}
			return
		}
	}
	t.Errorf("%s has no env %s (want %q)", c.Name, name, want)
}

func joinPorts(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name) // tests run in deploy/
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }

func deref(p *int) any {
	if p == nil {
		return "unset"
	}
	return *p
}
