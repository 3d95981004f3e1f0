package clients_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// mode is how the sandbox reaches egressd.
type mode string

const (
	// explicit: the clients run with HTTP(S)_PROXY naming egressd's proxy
	// listener, in the test's namespace, where no name resolves: a client that
	// ignored the proxy could not reach a stand-in by name.
	explicit mode = "explicit"
	// transparent: the clients run in a sandbox namespace (egressd-netns) with no
	// proxy settings; TCP 80/443 is DNATed to egressd's transparent listener and
	// DNS to its DNS guard.
	transparent mode = "transparent"
)

// The sandbox's addresses: 10.200.sandboxIndex.0/30, egressd on the host side.
const (
	sandboxName     = "clients"
	sandboxIndex    = 1
	transparentPort = 15002
	dnsGuardPort    = 15053
)

// readHeader is limits.read_header of both egressds: 2 s instead of the default
// 10 s, so that the idle-gap case (a gRPC stream quiet for longer than 15 s)
// stays quiet for eight times the deadline that used to cut such streams.
const readHeader = 2 * time.Second

// world is one mode's egressd, with its stub DNS, its sandbox (transparent) and
// the environment its clients run with.
type world struct {
	mode        mode
	up          *standIn
	dns         *dnsstub.Server
	e           *egressdtest.Egressd
	sb          *netns.Sandbox
	dir         string
	env         []string // the clients' environment
	bundle      string   // the merged CA bundle `egressd ca env` names
	placeholder string   // FIRESTORE_TOKEN as egressd's sandbox env gives it
	lat         *latencies
	mx          *matrix
}

// newWorld starts mode's world; its egressd stops when t ends.
func newWorld(t *testing.T, m mode, mx *matrix) *world {
	t.Helper()
	w := &world{mode: m, up: upstream(t), dns: dnsstub.Start(t), dir: t.TempDir(), lat: &latencies{mode: m}, mx: mx}
	for _, n := range standInNames {
		w.dns.Set(n, "A "+publicIP)
	}
	w.dns.Set(evilHost, "A "+forbiddenIP)
	if m == transparent {
		w.sb = netns.NewSandbox(t, "../../deploy/netns/egressd-netns", sandboxName, sandboxIndex,
			netns.SandboxPorts{Transparent: transparentPort, DNS: dnsGuardPort})
	}
	w.e = egressdtest.StartT(t, egressdtest.Options{Config: w.config(), Files: w.files(), LoopbackOnly: true,
		Wait: egressdtest.WaitReady})
	t.Cleanup(func() { w.stop(t) })
	w.env = w.clientEnv(t)
	w.placeholder = w.sandboxEnv(t)["FIRESTORE_TOKEN"]
	if len(w.placeholder) != len(firestoreValue) {
		t.Fatalf("placeholder %q is %d bytes, the value %d: the gRPC placeholder case needs them equal",
			w.placeholder, len(w.placeholder), len(firestoreValue))
	}
	return w
}

// config is the mode's egressd.yaml; paths are relative to its directory.
func (w *world) config() *egressdtest.Config {
	cfg := &egressdtest.Config{
		Version: 1, Environment: "env_clients",
		Listeners:   []egressdtest.Listener{{Name: "sandbox", Address: "127.0.0.1:0", Mode: "proxy"}},
		Admin:       &egressdtest.Admin{Address: "127.0.0.1:0"},
		Policy:      egressdtest.Policy{File: "environment.json"},
		Network:     egressdtest.Network{Resolver: w.dns.Addr},
		TLS:         &egressdtest.TLS{UpstreamCAFile: "upstream-ca.pem"},
		Credentials: &egressdtest.Credentials{Backend: "file", File: "credentials.json"},
		Limits:      &egressdtest.Limits{ReadHeader: readHeader.String()},
		Log:         &egressdtest.Log{Level: "debug", Format: "json"},
		StateDir:    "state",
	}
	if w.mode == transparent {
		cfg.Listeners = []egressdtest.Listener{{Name: "sandbox", Mode: "transparent", Redirect: "gateway",
			Address: w.sb.HostIP + ":" + strconv.Itoa(transparentPort)}}
		cfg.DNS = &egressdtest.DNS{Listen: w.sb.HostIP + ":" + strconv.Itoa(dnsGuardPort)}
	}
	return cfg
}

// files are the policy, the credentials and the stand-ins' CA.
func (w *world) files() map[string]string {
	policy := map[string]any{
		"network": map[string]any{"allowlist": []map[string]any{
			{"domain": githubHost}, {"domain": plainHost},
			{"domain": openaiHost, "credential": "openai"},
			{"domain": pubsubHost, "credential": "gcp"},
			{"domain": firestoreHost},
		}},
		"env": map[string]any{"FIRESTORE_TOKEN": map[string]string{"credential": firestoreCredential}},
	}
	creds := map[string]any{
		"openai": map[string]string{"token": openaiSecret},
		"gcp":    map[string]string{"token": gcpSecret},
		firestoreCredential: map[string]any{"type": "environment_variable", "value": firestoreValue,
			"injection_location": []string{"header", "body"}, "trusted_domains": []string{firestoreHost}},
	}
	p, _ := json.Marshal(policy)
	c, _ := json.Marshal(creds)
	return map[string]string{"environment.json": string(p), "credentials.json": string(c),
		"upstream-ca.pem": w.up.caPEM()}
}

func (s *standIn) caPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.ca.Cert.Raw}))
}

// clientEnv is what a sandbox's clients get: the CA trust `egressd ca env` prints
// and, in explicit mode, the proxy variables (lower case too: curl reads only
// http_proxy for http:// URLs). `egressd ca env` merges the "system roots" (what
// SSL_CERT_FILE names when it runs: here the stand-ins' CA, which stands for the
// public roots a real upstream chains to) with egressd's CA. Node adds
// NODE_EXTRA_CA_CERTS to roots of its own, which lack the stand-ins' CA, so here
// it names the merged bundle rather than egressd's CA alone.
func (w *world) clientEnv(t *testing.T) []string {
	t.Helper()
	home := filepath.Join(w.dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	ca := w.caEnv(t)
	w.bundle = ca["SSL_CERT_FILE"]
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "NODE_PATH=" + nodeModules(),
		"PIP_CONFIG_FILE=/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1",
		"GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "PYTHONDONTWRITEBYTECODE=1", "NO_COLOR=1"}
	for name, value := range ca {
		if name == "NODE_EXTRA_CA_CERTS" {
			value = ca["SSL_CERT_FILE"]
		}
		env = append(env, name+"="+value)
	}
	if w.mode == explicit {
		proxy := "http://" + w.e.Proxy
		for _, name := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
			env = append(env, name+"="+proxy)
		}
	}
	return env
}

// caEnv runs `egressd ca env --format json` on the world's config.
func (w *world) caEnv(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command(egressdtest.Binary(), "ca", "env", "--format", "json", "--config", w.e.ConfigPath)
	cmd.Dir = w.e.Dir
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+filepath.Join(w.e.Dir, "upstream-ca.pem"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("egressd ca env: %v\n%s", err, out)
	}
	var v struct{ Env map[string]string }
	if err := json.Unmarshal(out, &v); err != nil || v.Env["SSL_CERT_FILE"] == "" {
		t.Fatalf("egressd ca env printed %s (%v)", out, err)
	}
	return v.Env
}

// sandboxEnv is the admin API's /v1/sandbox/env: the placeholders.
func (w *world) sandboxEnv(t *testing.T) map[string]string {
	t.Helper()
	var env map[string]string
	if err := w.e.AdminJSON("/v1/sandbox/env", 200, &env); err != nil {
		t.Fatal(err)
	}
	return env
}

// stop ends egressd and fails t on what it must never do: exit uncleanly, race,
// panic, or write a planted value.
func (w *world) stop(t *testing.T) {
	if _, err := w.e.Stop(); err != nil {
		t.Error(err)
	}
	if code := w.e.ExitCode(); code != 0 {
		t.Errorf("egressd (%s) exited with %d", w.mode, code)
	}
	for _, f := range w.e.Faults() {
		t.Error(f)
	}
	if v := leaked(string(w.e.LogBytes()) + string(w.e.Stderr())); v != "" {
		t.Errorf("egressd (%s) wrote the planted value of %s", w.mode, v)
	}
}

// leaked names the planted value out holds, in any case, or "".
func leaked(out string) string {
	low := strings.ToLower(out)
	for v, mark := range secrets {
		if strings.Contains(low, strings.ToLower(v)) {
			return mark
		}
	}
	return ""
}

// clientTimeout bounds one client run.
const clientTimeout = 60 * time.Second

// output is what a client run printed.
type output struct {
	stdout, stderr string
	err            error // the exit status
	timedOut       bool
}

func (o output) String() string {
	return fmt.Sprintf("stdout:\n%s\nstderr:\n%s\nexit: %v", o.stdout, o.stderr, o.err)
}

// run runs a client program as the sandbox does (exec) and fails t if it did not
// end in time or printed a planted value.
func (w *world) run(t *testing.T, env []string, name string, args ...string) output {
	t.Helper()
	o := w.exec(env, name, args...)
	w.checkOutput(t, name, o)
	return o
}

// exec runs a client program as the sandbox does (transparent: inside the
// sandbox namespace) with the world's client environment plus env.
func (w *world) exec(env []string, name string, args ...string) output {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if w.sb != nil {
		cmd = w.sb.Command(ctx, name, args...)
	}
	cmd.Env = append(append([]string(nil), w.env...), env...)
	cmd.Dir = w.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return output{stdout: stdout.String(), stderr: stderr.String(), err: err, timedOut: errors.Is(ctx.Err(), context.DeadlineExceeded)}
}

// checkOutput fails t if the run timed out or printed a planted value.
func (w *world) checkOutput(t *testing.T, name string, o output) {
	t.Helper()
	if o.timedOut {
		t.Errorf("%s did not end within %v", name, clientTimeout)
	}
	if v := leaked(o.stdout + o.stderr); v != "" {
		t.Errorf("%s printed the planted value of %s:\n%s", name, v, o)
	}
}

// jsonLines decodes every JSON line of out into a T (other lines are skipped).
func jsonLines[T any](out string) []T {
	var ls []T
	for _, l := range strings.Split(out, "\n") {
		var v T
		if json.Unmarshal([]byte(l), &v) == nil {
			ls = append(ls, v)
		}
	}
	return ls
}
