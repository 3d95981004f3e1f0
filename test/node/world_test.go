package node_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/testpki"
	"github.com/egressd/egressd/pkg/hookauth"
)

// The world's fixed addresses: the upstreams listen on upstreamIP:443 in the test's
// namespace, where egressd dials them; a sandbox's clients address them at
// sandboxDst, which only its REDIRECT rule makes mean anything.
const (
	upstreamIP      = "127.0.0.10"
	sandboxDst      = "203.0.113.1"
	transparentPort = "15002"
)

// sandboxHosts are the upstream names: each policy allows some of them.
var sandboxHosts = []string{"a.test", "b.test", "c.test"}

// hit is one request an upstream served: its host, path, Authorization, X-Token,
// hook assertion, body and X-From (the test's own label of the sandbox it sent
// the request from; egressd reads nothing from it).
type hit struct{ host, path, auth, token, assertion, body, from string }

// upstream is the far end: one TLS server for every name, recording what it saw.
type upstream struct {
	ca   *testpki.CA
	mu   sync.Mutex
	hits []hit
}

func startUpstream(t *testing.T, hosts []string) *upstream {
	u := &upstream{ca: testpki.New(t)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	ln, err := net.Listen("tcp", upstreamIP+":443")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{u.ca.Leaf(t, hosts...)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return u
}

// serve records the request; /hold then answers and holds the response open
// until the client goes, as a long download or a stream would.
func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.hits = append(u.hits, hit{host: r.Host, path: r.URL.Path, auth: r.Header.Get("Authorization"), token: r.Header.Get("X-Token"),
		assertion: r.Header.Get(hookauth.HeaderName), body: string(body), from: r.Header.Get("X-From")})
	u.mu.Unlock()
	switch r.URL.Path {
	case "/slow":
		time.Sleep(1500 * time.Millisecond)
	case "/hook/slow":
		time.Sleep(time.Second)
		r.URL.Path = "/hook"
	}
	if r.URL.Path == "/hook" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"decision": "allow"}`)
		return
	}
	w.WriteHeader(http.StatusOK)
	fmt.Fprintln(w, "hello from", r.Host)
	if r.URL.Path == "/hold" {
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// hookCalls lists the hook calls the upstream served.
func (u *upstream) hookCalls() []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []hit
	for _, h := range u.hits {
		if h.path == "/hook" {
			out = append(out, h)
		}
	}
	return out
}

// seen reports whether the upstream has begun serving a request for path.
func (u *upstream) seen(path string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.ContainsFunc(u.hits, func(h hit) bool { return h.path == path })
}

// tokens lists the X-Token values the upstream saw.
func (u *upstream) tokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, h := range u.hits {
		if h.token != "" {
			out = append(out, h.token)
		}
	}
	return out
}

// authsFor lists the Authorization values the upstream saw for host.
func (u *upstream) authsFor(host string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, h := range u.hits {
		if h.host == host && h.path != "/hook" {
			out = append(out, h.auth)
		}
	}
	return out
}

// world is a node egressd with its upstream, stub DNS and sandbox namespaces.
type world struct {
	up      *upstream
	e       *egressdtest.Egressd
	dir     string
	socket  string
	bundle  string // the CA bundle the sandboxes trust: egressd's CA and the upstream's
	api     *egressdtest.NodeAPI
	secrets map[string]string // credential file name -> its secret
}

const nodeConfig = `version: 1
environment: env_node
admin: {address: "127.0.0.1:0"}
node:
  api_socket: run/node.sock
  sandboxes_dir: sandboxes.d
network:
  resolver: %q
  unsafe_allow_cidrs: ["127.0.0.0/8"]
tls: {upstream_ca_file: upstream-ca.pem}
credentials: %s
log: {level: debug}
state_dir: state
`

// newWorld is the three-sandbox world: file credentials, one file per scope.
func newWorld(t *testing.T) *world {
	return newWorldWith(t, "{backend: file, file: node-creds.json}", sandboxHosts, nil)
}

// newWorldWith starts the upstream for hosts, the stub DNS naming them, and a node
// egressd with the credentials section creds and extra files in its directory.
func newWorldWith(t *testing.T, creds string, hosts []string, extra map[string]string) *world {
	t.Helper()
	w := &world{up: startUpstream(t, hosts), dir: t.TempDir(), secrets: map[string]string{}}
	dns := dnsstub.Start(t)
	for _, h := range hosts {
		dns.Set(h, "A "+upstreamIP)
	}
	files := map[string]string{"upstream-ca.pem": string(w.up.ca.PEM())}
	maps.Copy(files, extra)
	for _, name := range []string{"node", "a", "b"} {
		w.secrets[name] = "secret-" + name + "-" + fmt.Sprint(time.Now().UnixNano())
		files[name+"-creds.json"] = fmt.Sprintf(`{"key": {"token": %q}, "ph": {"type": "environment_variable", "value": %q, "injection_location": "header", "trusted_domains": ["a.test"]}}`,
			w.secrets[name], w.secrets[name]+"-ph")
	}
	if err := os.MkdirAll(filepath.Join(w.dir, "sandboxes.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	w.e = egressdtest.StartT(t, egressdtest.Options{Dir: w.dir, RawConfig: fmt.Sprintf(nodeConfig, dns.Addr, creds), Files: files,
		LoopbackOnly: true, ProxyListener: "node_api", Wait: egressdtest.WaitReady})
	t.Cleanup(func() { w.stop(t) })
	w.socket = filepath.Join(w.dir, "run", "node.sock")
	w.api = egressdtest.NewNodeAPI(w.socket)
	w.bundle = w.writeBundle(t)
	return w
}

// writeBundle writes egressd's CA and the upstream's into one file for curl.
func (w *world) writeBundle(t *testing.T) string {
	code, ca, err := w.e.AdminGet("/ca.pem")
	if err != nil || code != 200 {
		t.Fatalf("/ca.pem: %d %v", code, err)
	}
	path := filepath.Join(w.dir, "bundle.pem")
	if err := os.WriteFile(path, append(ca, w.up.ca.PEM()...), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// stop ends egressd and fails t on a race report, a panic or a leaked secret.
func (w *world) stop(t *testing.T) {
	if w.e.Alive() {
		if _, err := w.e.Stop(); err != nil {
			t.Error(err)
		}
	}
	for _, f := range w.e.Faults() {
		t.Error(f)
	}
	for _, s := range w.secrets {
		if bytes.Contains(w.e.LogBytes(), []byte(s)) || bytes.Contains(w.e.Stderr(), []byte(s)) {
			t.Errorf("a secret appears in egressd's output")
		}
	}
}

// spec is a sandbox spec: a transparent listener inside netns, the allowlist, and
// its own credentials file when creds is set.
func spec(netnsName, creds string, allow ...string) string {
	var entries []string
	for _, a := range allow {
		host, cred, _ := strings.Cut(a, "+")
		e := fmt.Sprintf(`{"domain": %q}`, host)
		if cred != "" {
			e = fmt.Sprintf(`{"domain": %q, "credential": %q}`, host, cred)
		}
		entries = append(entries, e)
	}
	s := fmt.Sprintf(`{"netns": "/run/netns/%s",
 "listeners": [{"name": "transparent", "address": "127.0.0.1:%s", "mode": "transparent"}],
 "environment": {"network": {"allowlist": [%s]}, "env": {"TOKEN": {"credential": "ph"}}}`, netnsName, transparentPort, strings.Join(entries, ", "))
	if creds != "" {
		s += fmt.Sprintf(`, "credentials": {"file": %q}`, creds)
	}
	return s + "}"
}

// put registers spec for sandbox id through the API and returns the status.
func (w *world) put(t *testing.T, id, spec string) (int, string) {
	t.Helper()
	return w.do(t, http.MethodPut, id, spec)
}

func (w *world) del(t *testing.T, id string) int {
	t.Helper()
	code, _ := w.do(t, http.MethodDelete, id, "")
	return code
}

func (w *world) get(t *testing.T, id string) (int, map[string]any) {
	t.Helper()
	code, body := w.do(t, http.MethodGet, id, "")
	var v map[string]any
	json.Unmarshal([]byte(body), &v)
	return code, v
}

func (w *world) do(t *testing.T, method, id, body string) (int, string) {
	t.Helper()
	code, b, err := w.api.Do(method, id, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, id, err)
	}
	return code, string(b)
}

// addSandbox makes network namespace name (sandboxCommands) with the REDIRECT
// of TCP 80 and 443 to egressd's transparent listener on its own loopback.
func addSandbox(t *testing.T, name string) {
	t.Helper()
	for _, c := range sandboxCommands(name) {
		if err := runSandboxCommand(c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
}

// sandboxCommands make addSandbox's namespace: three commands, the links and
// routes in one batch.
func sandboxCommands(name string) [][]string {
	return [][]string{
		{"ip", "netns", "add", name},
		{"ip", "-n", name, "-batch", "-"},
		{"ip", "netns", "exec", name, "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-m", "multiport",
			"--dports", "80,443", "-j", "REDIRECT", "--to-ports", transparentPort},
	}
}

// sandboxLinks is the batch of sandboxCommands: lo, a veth pair of the
// namespace's own with a default route (so a connection to any address gets as
// far as the nat table; the pair leads nowhere).
const sandboxLinks = `link set lo up
link add d0 type veth peer name d1
addr add 192.0.2.2/24 dev d0
link set d0 up
link set d1 up
route add default via 192.0.2.1
`

// runSandboxCommand runs one of sandboxCommands.
func runSandboxCommand(c []string) error {
	cmd := exec.Command(c[0], c[1:]...)
	if slices.Contains(c, "-batch") {
		cmd.Stdin = strings.NewReader(sandboxLinks)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
	}
	return nil
}

// curl fetches https://host/ from inside sandbox name and returns the status and
// the Egressd-Reason header ("" when egressd did not refuse it).
func (w *world) curl(t *testing.T, name, host string) (string, string) {
	return w.curlPath(t, name, host, "/")
}

// curlPath is curl for https://host/path, with extra arguments.
func (w *world) curlPath(t *testing.T, name, host, path string, extra ...string) (string, string) {
	args := append([]string{"netns", "exec", name, "curl", "-s", "-m", "10", "-o", "/dev/null", "-D", "-",
		"--cacert", w.bundle, "--resolve", host + ":443:" + sandboxDst, "-w", "%{http_code}"}, extra...)
	out, err := exec.Command("ip", append(args, "https://"+host+path)...).Output()
	if err != nil && len(out) == 0 {
		return "000", ""
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	reason := ""
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Egressd-Reason") {
			reason = strings.TrimSpace(v)
		}
	}
	return lines[len(lines)-1], reason
}

// roots is the upstream's CA, for clients of spliced tunnels.
func (u *upstream) roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(u.ca.PEM())
	return pool
}
