package conformance_test

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// egressd is one run of the real binary (internal/testutil/egressdtest) on a
// world's config, with the credentials file the credential cases damage.
type egressd struct {
	*egressdtest.Egressd
	t         *testing.T
	credPath  string
	ProxyAddr string // the sandbox listener; a case may aim at another address of it
	AdminAddr string
}

// config is what a world's egressd.yaml says beyond the fixed parts.
type config struct {
	allowlist []egressdtest.Entry // policy.allowlist
	resolver  string              // network.resolver
	unsafe    []string            // network.unsafe_allow_cidrs
	listener  string              // the sandbox listener's address; default 127.0.0.1:0
	admin     string              // the admin address; default 127.0.0.1:0
	limits    *egressdtest.Limits // limits; nil: egressd's defaults
	maxStale  string              // credentials.max_stale; default 5m
	hooks     string              // hooks.json, written beside the config and named by hooks.file
	// hooksListener adds a listener "hooks" with role hooks; identify is
	// hooks.identify.
	hooksListener bool
	identify      string
	// load runs egressd's build for load scenarios (envLoadEgressd), when there
	// is one.
	load      bool
	dnsListen string // dns.listen; "" = no DNS guard (see world.dnsAddr)
	// denyInTunnel is tls.deny_in_tunnel; default never, so a refused CONNECT's
	// own status carries the verdict the attack cases assert.
	denyInTunnel string
	bin          string // the egressd binary; default the one TestMain built
	// wrap prefixes egressd's command (egressdtest.Options.Wrap): a memory cgroup.
	wrap []string
}

// startEgressd writes the config, the credentials file (with the planted secret) and
// the upstream CA into a temporary directory, starts egressd on them inside this
// loopback-only namespace and waits until it serves and its credential backend has
// answered. The test's end stops it (see stop).
func startEgressd(t *testing.T, fx *fixtures, c config) *egressd {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"upstream-ca.pem": string(fx.upstreamCA.PEM()), "credentials.json": goodCredentials()}
	if c.hooks != "" {
		files["hooks.json"] = c.hooks
	}
	e := &egressd{t: t, credPath: filepath.Join(dir, "credentials.json")}
	bin := c.bin
	if c.load {
		bin = os.Getenv(envLoadEgressd)
	}
	e.Egressd = egressdtest.StartT(t, egressdtest.Options{
		Bin: bin, Dir: dir, Config: c.egressdConfig(), Files: files, LoopbackOnly: true, Wrap: c.wrap,
		Wait: egressdtest.WaitReady, StartTimeout: startTimeout, StopTimeout: stopTimeout,
	})
	e.ProxyAddr, e.AdminAddr = e.Proxy, e.Admin
	t.Cleanup(e.stop)
	return e
}

// Bounds on egressd's lifecycle, so that a broken build cannot hang the suite.
const (
	startTimeout = 15 * time.Second // listeners bound, /healthz and /readyz 200
	stopTimeout  = 10 * time.Second // SIGTERM to exit; then SIGKILL
)

// goodCredentials is the credentials file with the planted secret.
func goodCredentials() string { return fmt.Sprintf("{\"api\": {\"token\": %q}}\n", secret) }

// egressdConfig is the world's egressd.yaml. Paths are relative to its directory.
func (c config) egressdConfig() *egressdtest.Config {
	cfg := &egressdtest.Config{
		Version: 1, Environment: "env_conformance",
		Listeners: []egressdtest.Listener{{Name: "sandbox", Address: or(c.listener, "127.0.0.1:0"), Mode: "proxy", Role: "sandbox"}},
		Admin:     &egressdtest.Admin{Address: or(c.admin, "127.0.0.1:0")},
		Policy:    egressdtest.Policy{Allowlist: c.allowlist},
		Network:   egressdtest.Network{Resolver: c.resolver, UnsafeAllowCIDRs: c.unsafe},
		TLS: &egressdtest.TLS{Intercept: "auto", DenyInTunnel: or(c.denyInTunnel, "never"),
			UpstreamCAFile: "upstream-ca.pem"},
		Credentials: &egressdtest.Credentials{Backend: "file", File: "credentials.json", MaxStale: or(c.maxStale, "5m")},
		Limits:      c.limits,
		Log:         &egressdtest.Log{Level: "debug", Format: "json"},
		StateDir:    "state",
	}
	if c.dnsListen != "" {
		cfg.DNS = &egressdtest.DNS{Listen: c.dnsListen}
	}
	if c.hooks != "" {
		cfg.Hooks = &egressdtest.Hooks{File: "hooks.json", Identify: c.identify}
	}
	if c.hooksListener {
		cfg.Listeners = append(cfg.Listeners, egressdtest.Listener{Name: "hooks", Address: "127.0.0.1:0", Mode: "proxy", Role: "hooks"})
	}
	return cfg
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// caPool returns egressd's interception CA.
func (e *egressd) caPool() *x509.CertPool {
	e.t.Helper()
	pool, err := e.CAPool()
	if err != nil {
		e.t.Fatal(err)
	}
	return pool
}

// adminGet fetches path from the admin listener, directly (never through a proxy).
func (e *egressd) adminGet(path string) (int, []byte, error) { return e.AdminGet(path) }

// stop ends egressd with SIGTERM (SIGKILL after the harness's stop timeout) unless
// a case already stopped it, and fails the test on anything egressd must never do:
// exit uncleanly, report a data race, recover a panic, or write the secret.
func (e *egressd) stop() {
	t := e.t
	if e.Alive() {
		if _, err := e.Stop(); err != nil {
			t.Error(err)
		}
	}
	if code := e.ExitCode(); code != 0 {
		t.Errorf("egressd exited with %d, want 0", code)
	}
	for _, f := range e.Faults() {
		t.Error(f)
	}
	if e.leaked() {
		t.Errorf("the secret appears in egressd's output")
	}
}

// leaked reports whether the secret appears in egressd's log or stderr.
func (e *egressd) leaked() bool {
	return bytes.Contains(e.LogBytes(), []byte(secret)) || bytes.Contains(e.Stderr(), []byte(secret))
}

// logLines returns egressd's JSON log lines so far.
func (e *egressd) logLines() []egressdtest.Line {
	lines, err := e.Lines()
	if err != nil {
		e.t.Fatal(err)
	}
	return lines
}

// egressLines returns the canonical "egress" lines so far.
func (e *egressd) egressLines() []egressdtest.Line { return e.EgressLines() }
