package deploy_test

import (
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/egressd/egressd/internal/config"
	egressdtls "github.com/egressd/egressd/internal/tls"
)

// adminView is the admin section of egressd's config as written (a Unix socket
// or a loopback address for the admin listener, the health listener the one port
// the pod exposes), beside what the config parser makes of it.
type adminView struct {
	Address       string `yaml:"address"`
	HealthAddress string `yaml:"health_address"`
	Exposed       bool   `yaml:"exposed"`
	Token         any    `yaml:"token"`
}

func readAdmin(t *testing.T, text string) adminView {
	t.Helper()
	var doc struct {
		Admin adminView `yaml:"admin"`
	}
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("egressd.yaml: %v", err)
	}
	return doc.Admin
}

// checkAdminSplit: explain, reload, the sandbox's env, the CA and the JWKS stay
// on a loopback (or unix://) admin listener, closed to the pod's other uids;
// probes, Prometheus and the NetworkPolicy name the health port and nothing else.
func checkAdminSplit(t *testing.T, w *workload, admin adminView, egressd, initC container) {
	if admin.Exposed || admin.Token != nil {
		t.Errorf("admin.exposed/admin.token set: the shipped pod never exposes the admin listener")
	}
	adminPort := 0
	if !strings.HasPrefix(admin.Address, "unix://") {
		ap, err := netip.ParseAddrPort(admin.Address)
		if err != nil || !ap.Addr().IsLoopback() {
			t.Fatalf("admin.address %q: want a loopback address or unix://, never one other pods reach", admin.Address)
		}
		adminPort = int(ap.Port())
		wantEnv(t, initC, "EGRESSD_ADMIN_PORT", strconv.Itoa(adminPort))
	}
	hp, err := netip.ParseAddrPort(admin.HealthAddress)
	if err != nil {
		t.Fatalf("admin.health_address %q: want host:port, where probes and Prometheus reach /healthz, /readyz and /metrics", admin.HealthAddress)
	}
	health := int(hp.Port())
	wantEnv(t, initC, "EGRESSD_HEALTH_PORT", strconv.Itoa(health))
	wantPort(t, egressd, "health", "TCP", health)
	for _, p := range egressd.Ports {
		if p.ContainerPort == adminPort {
			t.Errorf("containerPort %s is the admin port %d: nothing outside the pod may reach it", p.Name, adminPort)
		}
	}
	for name, p := range map[string]*probe{"startupProbe": egressd.StartupProbe, "readinessProbe": egressd.ReadinessProbe, "livenessProbe": egressd.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port != health {
			t.Errorf("%s: want an httpGet on the health port %d", name, health)
		}
	}
	if egressd.LivenessProbe.HTTPGet.Path != "/healthz" || egressd.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes: liveness %s, readiness %s; want /healthz and /readyz",
			egressd.LivenessProbe.HTTPGet.Path, egressd.ReadinessProbe.HTTPGet.Path)
	}
	checkNetworkPolicy(t, w, health)
	checkScrape(t, w, egressd, health)
	checkRules(t, w)
}

// checkRules: a PrometheusRule watches the CA's expiry and credentials that
// cannot be served (the pod stays ready while one cannot).
func checkRules(t *testing.T, w *workload) {
	for _, o := range w.others {
		if o.Kind != "PrometheusRule" {
			continue
		}
		var exprs []string
		for _, g := range o.Spec.Groups {
			for _, r := range g.Rules {
				exprs = append(exprs, r.Expr)
			}
		}
		for _, must := range []string{"egressd_ca_expiry_timestamp_seconds", "egressd_credential_ready"} {
			if !strings.Contains(strings.Join(exprs, "\n"), must) {
				t.Errorf("PrometheusRule %s does not watch %s", o.Metadata.Name, must)
			}
		}
	}
}

// checkNetworkPolicy: a NetworkPolicy selects the pod for ingress and admits
// the health port alone.
func checkNetworkPolicy(t *testing.T, w *workload, health int) {
	var found bool
	for _, o := range w.others {
		if o.Kind != "NetworkPolicy" {
			continue
		}
		found = true
		if !slices.Contains(o.Spec.PolicyTypes, "Ingress") {
			t.Errorf("NetworkPolicy %s: policyTypes %v lacks Ingress", o.Metadata.Name, o.Spec.PolicyTypes)
		}
		for _, in := range o.Spec.Ingress {
			if len(in.Ports) == 0 {
				t.Errorf("NetworkPolicy %s: an ingress rule without ports admits every port", o.Metadata.Name)
			}
			for _, p := range in.Ports {
				if fmt.Sprint(p.Port) != strconv.Itoa(health) && p.Port != "health" {
					t.Errorf("NetworkPolicy %s admits port %v; only the health port %d may be reached", o.Metadata.Name, p.Port, health)
				}
			}
		}
	}
	if !found {
		t.Errorf("no NetworkPolicy: every port of the pod is open to the cluster")
	}
}

// checkScrape: Prometheus is pointed at the health port, by the
// prometheus.io annotations or a PodMonitor.
func checkScrape(t *testing.T, w *workload, egressd container, health int) {
	if w.podAnnotations["prometheus.io/scrape"] == "true" {
		if w.podAnnotations["prometheus.io/port"] != strconv.Itoa(health) || w.podAnnotations["prometheus.io/path"] != "/metrics" {
			t.Errorf("prometheus.io annotations %v: want port %d, path /metrics", w.podAnnotations, health)
		}
		return
	}
	for _, o := range w.others {
		if o.Kind != "PodMonitor" {
			continue
		}
		for _, e := range o.Spec.PodMetricsEndpoints {
			named := slices.ContainsFunc(egressd.Ports, func(p containerPort) bool { return p.Name == e.Port && p.ContainerPort == health })
			if !named || e.Path != "/metrics" {
				t.Errorf("PodMonitor %s endpoint port %q path %q: want the health port's name and /metrics", o.Metadata.Name, e.Port, e.Path)
			}
		}
		return
	}
	t.Errorf("neither prometheus.io annotations nor a PodMonitor: Prometheus does not find /metrics")
}

// checkIstioClear: nothing of egressd's is in Istio's reserved set, so the pod
// can be injected: no container runs as istio-proxy's uid, and no port egressd
// listens on or the init rules name is one of Istio's.
func checkIstioClear(t *testing.T, w *workload, cfg *config.Config, admin adminView) {
	for _, c := range append(slices.Clone(w.pod.InitContainers), w.pod.Containers...) {
		if u := c.SecurityContext.RunAsUser; u != nil && *u == istioUID {
			t.Errorf("container %s runs as %d, istio-proxy's uid: istio-init's rules let it bypass Envoy", c.Name, istioUID)
		}
		for _, p := range c.Ports {
			if istioPort(p.ContainerPort) {
				t.Errorf("container %s port %s %d is in Istio's %d-%d", c.Name, p.Name, p.ContainerPort, istioPortLow, istioPortHigh)
			}
		}
	}
	initC := w.container(t, "egressd-init")
	if u := envValue(initC, "EGRESSD_UID"); u == strconv.Itoa(istioUID) {
		t.Errorf("EGRESSD_UID %s is istio-proxy's uid", u)
	}
	for _, p := range strings.Split(initOwnPorts(initC), ",") {
		if n, _ := strconv.Atoi(p); istioPort(n) {
			t.Errorf("egressd-init names port %d, in Istio's %d-%d", n, istioPortLow, istioPortHigh)
		}
	}
	addrs := []string{admin.Address, admin.HealthAddress, cfg.DNS.Listen}
	for _, l := range cfg.Listeners {
		addrs = append(addrs, l.Address.String())
	}
	for _, a := range addrs {
		if ap, err := netip.ParseAddrPort(a); err == nil && istioPort(int(ap.Port())) {
			t.Errorf("egressd.yaml listens on %s, in Istio's %d-%d", a, istioPortLow, istioPortHigh)
		}
	}
}

// checkResources: every container asks for CPU and memory (a namespace with a
// ResourceQuota rejects a pod that does not), and egressd's memory is capped
// where the sidecar config's limits were sized for.
func checkResources(t *testing.T, w *workload) {
	for _, c := range append(slices.Clone(w.pod.InitContainers), w.pod.Containers...) {
		if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
			t.Errorf("container %s: requests %v, want cpu and memory", c.Name, c.Resources.Requests)
		}
	}
	if got := w.container(t, "egressd").Resources.Limits["memory"]; got != egressdMemoryLimit {
		t.Errorf("egressd memory limit %q, want %s (max_connections and limits.memory are sized for it)", got, egressdMemoryLimit)
	}
}

// initOwnPorts is the init container's list of egressd's TCP ports, in the
// order egressd-init.sh builds it.
func initOwnPorts(c container) string {
	var ports []string
	for _, v := range []string{"EGRESSD_ADMIN_PORT", "EGRESSD_TPROXY_PORT", "EGRESSD_DNS_PORT", "EGRESSD_HEALTH_PORT", "EGRESSD_HOOKS_PORT", "EGRESSD_OTHER_PORTS"} {
		if e := envValue(c, v); e != "" {
			ports = append(ports, e)
		}
	}
	return strings.Join(ports, ",")
}

// checkCredentialMounts: what egressd logs in to Vault with, or the credentials
// file, is on a volume mounted into egressd: a projected service-account token
// for the kubernetes and jwt methods (with an audience, so it is good for Vault
// alone), a Secret for approle, token and the file backend.
func checkCredentialMounts(t *testing.T, w *workload, cfg *config.Config, egressd container) {
	c := cfg.Credentials
	if c.Backend == config.BackendFile {
		if v := w.mountVolume(egressd, path.Dir(c.File)); v == nil || v.Secret == nil {
			t.Errorf("credentials.file %s is not on a Secret mounted into egressd", c.File)
		}
		return
	}
	a := c.Vault.Auth
	switch a.Method {
	case config.AuthKubernetes, config.AuthJWT:
		v := w.mountVolume(egressd, path.Dir(a.JWTFile))
		if v == nil || v.Projected == nil || len(v.Projected.Sources) != 1 {
			t.Fatalf("jwt_file %s is not a projected service account token mounted into egressd", a.JWTFile)
		}
		tok := v.Projected.Sources[0].ServiceAccountToken
		if tok == nil || tok.Path != path.Base(a.JWTFile) || tok.Audience == "" {
			t.Errorf("jwt_file %s: want a projected service account token with an audience (docs/vault.md)", a.JWTFile)
		}
	default:
		for _, f := range []string{a.RoleIDFile, a.SecretIDFile, a.TokenFile} {
			if v := w.mountVolume(egressd, path.Dir(f)); f != "" && (v == nil || v.Secret == nil) {
				t.Errorf("%s is not on a Secret mounted into egressd", f)
			}
		}
	}
}

// checkAgentTrust: every workload container trusts egressd's CA as `egressd ca
// env` makes a host's sandbox trust it (the merged bundle, the CA alone for
// Node, the Java trust store), from the files egressd writes into
// tls.ca_public_dir, on a volume egressd mounts writable and the container
// read-only at the same path.
func checkAgentTrust(t *testing.T, w *workload, cfg *config.Config, egressd container) {
	dir := cfg.TLS.CAPublicDir
	own := mountAbove(egressd, dir)
	if own == nil || own.ReadOnly || w.volume(own.Name) == nil || w.volume(own.Name).EmptyDir == nil {
		t.Fatalf("tls.ca_public_dir %s is not on a writable emptyDir mount of egressd", dir)
	}
	pub := egressdtls.Public{Dir: dir, Cert: path.Join(dir, egressdtls.PublicCertName),
		Bundle: path.Join(dir, egressdtls.BundleName), TrustStore: path.Join(dir, egressdtls.TrustStoreName)}
	for _, c := range w.pod.Containers {
		m := mountAbove(c, dir)
		if m == nil || m.Name != own.Name || m.MountPath != own.MountPath || !m.ReadOnly {
			t.Errorf("container %s does not mount egressd's %s read-only at %s", c.Name, own.Name, own.MountPath)
		}
		for _, kv := range egressdtls.ClientEnv(pub) {
			name, value, _ := strings.Cut(kv, "=")
			wantEnv(t, c, name, value)
		}
	}
}

// mountAbove is c's volume mount that holds dir, the deepest one.
func mountAbove(c container, dir string) *volumeMount {
	var best *volumeMount
	for i, m := range c.VolumeMounts {
		mp := path.Clean(m.MountPath)
		if (dir == mp || strings.HasPrefix(dir, mp+"/")) && (best == nil || len(mp) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	return best
}
