package daemon_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// nodeWorld is a node egressd run in this process, with an upstream for every
// name on 127.0.0.1:443 and a stub DNS server naming it, all inside the test's
// loopback-only network namespace.
type nodeWorld struct {
	dir   string
	m     *metrics.Metrics
	api   *egressdtest.NodeAPI
	roots *x509.CertPool // the upstream's CA and egressd's
	up    *testpki.CA
}

// shareNodeConfig is the node's config, with its limits.
const shareNodeConfig = `version: 1
environment: env_node
node: {api_socket: run/node.sock}
network: {resolver: %q, unsafe_allow_cidrs: ["127.0.0.0/8"]}
tls: {upstream_ca_file: upstream-ca.pem}
credentials: {backend: file, file: creds.json}
limits: {%s}
state_dir: state
`

func startNode(t *testing.T, limits string) *nodeWorld {
	t.Helper()
	w := &nodeWorld{dir: t.TempDir(), m: metrics.New(), up: testpki.New(t)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hook" {
			rw.Header().Set("Content-Type", "application/json")
			fmt.Fprint(rw, `{"decision": "allow"}`)
			return
		}
		fmt.Fprint(rw, "hello")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:443")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the flood's tunnels end without TLS
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{w.up.Leaf(t, "up.test", "hook.test")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dns := dnsstub.Start(t)
	dns.Set("up.test", "A 127.0.0.1")
	dns.Set("hook.test", "A 127.0.0.1")
	files := map[string]string{"node.yaml": fmt.Sprintf(shareNodeConfig, dns.Addr, limits), "creds.json": "{}\n",
		"upstream-ca.pem": string(w.up.PEM())}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(w.dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(w.dir, "node.yaml")
	l, err := daemon.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d := daemon.New(path, zerolog.New(&syncbuf.Buffer{}), w.m)
	if err := d.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	socket := filepath.Join(w.dir, "run", "node.sock")
	w.api = egressdtest.NewNodeAPI(socket)
	caPEM, err := os.ReadFile(filepath.Join(w.dir, "state", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	w.roots = x509.NewCertPool()
	w.roots.AppendCertsFromPEM(caPEM)
	w.roots.AppendCertsFromPEM(w.up.PEM())
	return w
}

// shareSpec is a sandbox with a proxy listener and a hooks listener for its
// runtime, allowed up.test and hook.test, whose pre-tool hook is https://hook.test/hook.
const shareSpec = `{"listeners": [{"name": "proxy", "address": "127.0.0.1:0"},
                {"name": "hooks", "address": "127.0.0.1:0", "role": "hooks"}],
 "environment": {"network": {"allowlist": [{"domain": "up.test"}, {"domain": "hook.test"}]},
   "sources": [{"path": ".agents/hooks.json", "content": {"gate": {"pre_tool_execution": [
     {"matcher": "*", "hooks": [{"type": "http", "url": "https://hook.test/hook", "timeout": 5}]}]}}}]}}`

// register puts spec for id and returns its bound listeners.
func (w *nodeWorld) register(t *testing.T, id, spec string) map[string]string {
	t.Helper()
	code, body, err := w.api.Do(http.MethodPut, id, spec)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("PUT %s: %d %s %v", id, code, body, err)
	}
	var st struct {
		Listeners map[string]string `json:"listeners"`
	}
	w.status(t, id, &st)
	return st.Listeners
}

// status decodes GET /v1/sandboxes/{id} into v.
func (w *nodeWorld) status(t *testing.T, id string, v any) {
	t.Helper()
	_, body, err := w.api.Do(http.MethodGet, id, "")
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// nodeMemory is the node's memory budget as its metrics show it: the bytes held
// by every holder together, and the limit.
func (w *nodeWorld) nodeMemory(t *testing.T) (used, limit float64) {
	t.Helper()
	mfs, err := w.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "egressd_memory_budget_bytes":
				used += m.GetGauge().GetValue()
			case "egressd_memory_budget_limit_bytes":
				limit = m.GetGauge().GetValue()
			}
		}
	}
	return used, limit
}

// client is an HTTP client through the proxy listener at addr.
func (w *nodeWorld) client(addr string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: addr}),
		TLSClientConfig:   &tls.Config{RootCAs: w.roots},
		DisableKeepAlives: true,
	}}
}

// holdTunnel opens a CONNECT tunnel to up.test through addr and leaves it open
// until done; it returns the answer's status and the refusal's detail.
func holdTunnel(addr string, done <-chan struct{}) (int, string) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err.Error()
	}
	go func() { <-done; nc.Close() }()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(nc, "CONNECT up.test:443 HTTP/1.1\r\nHost: up.test:443\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return 0, err.Error()
	}
	var body struct{ Detail string }
	if resp.StatusCode != http.StatusOK {
		json.NewDecoder(resp.Body).Decode(&body)
	}
	nc.SetDeadline(time.Time{})
	return resp.StatusCode, body.Detail
}

// holdTunnels opens n tunnels through addr at once, holding those answered 200
// until done, and returns how many were and the others' answers.
func holdTunnels(addr string, n int, done <-chan struct{}) (int, map[string]int) {
	results := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			code, detail := holdTunnel(addr, done)
			results <- fmt.Sprint(code, " ", detail)
		})
	}
	wg.Wait()
	close(results)
	held, refused := 0, map[string]int{}
	for r := range results {
		if r == "200 " {
			held++
		} else {
			refused[r]++
		}
	}
	return held, refused
}

// TestNodeConnections: the node's limits.max_connections bounds every
// sandbox's connections together: with A holding its 30, C gets the 10 the node
// has left, and is refused node_max_connections beyond them.
func TestNodeConnections(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		w := startNode(t, "memory: 64MiB, max_connections: 40")
		spec := strings.Replace(shareSpec, `{"listeners"`, `{"limits": {"max_connections": 30}, "listeners"`, 1)
		a, c := w.register(t, "sbx-a", spec), w.register(t, "sbx-c", spec)
		done := make(chan struct{})
		defer close(done)
		if held, refused := holdTunnels(a["proxy"], 30, done); held != 30 {
			t.Fatalf("A held %d of its 30 tunnels; refused %v", held, refused)
		}
		held, refused := holdTunnels(c["proxy"], 30, done)
		if held != 10 || refused["503 node_max_connections"] == 0 {
			t.Errorf("C held %d tunnels, refused %v; want the node's 10 left, then 503 node_max_connections", held, refused)
		}
	})
}

// TestSandboxShares: sandbox A, flooded with tunnels it holds open, spends its
// own share of the node's memory budget and no more; meanwhile sandbox B's
// requests are served and every pre-tool hook call of its runtime is answered
// within the hook's timeout, and the node's total stays within its limit.
func TestSandboxShares(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		w := startNode(t, "memory: 32MiB") // hook bodies stand aside 16 MiB of it
		a, b := w.register(t, "sbx-a", shareSpec), w.register(t, "sbx-b", shareSpec)
		done := make(chan struct{})
		defer close(done)
		const flood = 250 // each costs about 92 KiB held: 23 MiB, more than the node has beside hook bodies
		held, details := holdTunnels(a["proxy"], flood, done)
		t.Logf("sandbox A's flood: %d tunnels held, refused %v", held, details)
		if held == 0 || held == flood || details["503 memory_conns"] == 0 {
			t.Fatalf("A held %d of %d tunnels, refused %v: want its share spent (503 memory_conns)", held, flood, details)
		}
		var sa struct {
			Memory struct {
				Limit   int64 `json:"limit_bytes"`
				Used    int64 `json:"used_bytes"`
				Refused int64 `json:"refused"`
			} `json:"memory"`
		}
		w.status(t, "sbx-a", &sa)
		if sa.Memory.Refused == 0 {
			t.Errorf("A's status shows no refusal of its share: %+v", sa.Memory)
		}
		hook, plain := w.client(b["hooks"], 5*time.Second), w.client(b["proxy"], 10*time.Second)
		for i := range 10 {
			start := time.Now()
			resp, err := hook.Post("https://hook.test/hook", "application/json", strings.NewReader(`{"tool_name": "bash"}`))
			if err != nil {
				t.Fatalf("B's hook call %d: %v", i, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"allow"`) {
				t.Fatalf("B's hook call %d after %v: %d %s", i, time.Since(start), resp.StatusCode, body)
			}
			resp, err = plain.Get("https://up.test/")
			if err != nil {
				t.Fatalf("B's request %d: %v", i, err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("B's request %d: %d %s %s", i, resp.StatusCode, resp.Header.Get("Egressd-Reason"), body)
			}
			if used, limit := w.nodeMemory(t); limit == 0 || used > limit {
				t.Fatalf("the node holds %.0f of %.0f bytes", used, limit)
			}
		}
	})
}

// TestNodeListenersAreSelf: a sandbox's listener in egressd's own namespace is
// one of egressd's own addresses, which no request reaches: sandbox A, whose
// policy allows B's listener's address (loopback, opened by the node's
// unsafe_allow_cidrs), is refused internal_address (self) and B's listener sees
// no request.
func TestNodeListenersAreSelf(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		w := startNode(t, "memory: 64MiB")
		b := w.register(t, "sbx-b", shareSpec)
		_, port, _ := net.SplitHostPort(b["proxy"])
		spec := fmt.Sprintf(`{"listeners": [{"name": "proxy", "address": "127.0.0.1:0"}],
 "environment": {"network": {"allowlist": [{"domain": "up.test", "ports": [%s]}]}}}`, port)
		a := w.register(t, "sbx-a", spec)
		resp, err := w.client(a["proxy"], 10*time.Second).Get("http://up.test:" + port + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Egressd-Reason") != "internal_address" {
			t.Fatalf("A to B's listener: %d %s, want 403 internal_address", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
		}
		var st struct {
			Requests map[string]int64 `json:"requests"`
		}
		w.status(t, "sbx-b", &st)
		if n := st.Requests["allow"] + st.Requests["deny"] + st.Requests["error"]; n != 0 {
			t.Errorf("B's listener saw %d requests, want none", n)
		}
	})
}
