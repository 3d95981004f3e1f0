package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy"
	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
	mitm "github.com/egressd/egressd/internal/tls"

	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// The whole package runs inside a loopback-only network namespace of its own
// (netns.Main), so every address below exists only there: a guard bug can reach a
// canary in the namespace, never a host outside it.
func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// publicIPs hands each world its own upstream address; they stand for public
// upstreams and exist only inside the test namespace.
var publicIPs atomic.Int32

func nextPublicIP() string { return fmt.Sprintf("93.184.216.%d", 10+publicIPs.Add(1)) }

// canaryAddrs are internal addresses a request must never reach. Each gets a listener
// on port 80 that counts connections.
var canaryAddrs = []string{
	"127.0.0.1", "169.254.169.254", "10.0.0.5", "100.64.0.5", "192.168.1.5",
	"172.16.0.5", "fd00:ec2::254", "::1", "fd12::5",
}

// world is one scenario's fixture: egressd's proxy on a real listener, an echo
// upstream (HTTP on :80, HTTPS on :443 with its own CA) on publicIP, a canary on
// every internal address, and a stub DNS server the proxy resolves through.
type world struct {
	t          *testing.T
	PublicIP   string
	ProxyAddr  string
	Server     *proxy.Server
	Metrics    *metrics.Metrics
	DNS        *dnsstub.Server
	Upstream   *echo
	UpstreamCA *x509.CertPool
	// UpstreamPKI signs the upstreams' certificates; egressd trusts it.
	UpstreamPKI *testpki.CA
	// CA is egressd's interception CA; clients of intercepted tunnels trust it.
	CA            *mitm.CA
	CAPool        *x509.CertPool
	upstreamCAPEM []byte
	credFile      string
	Signer        *hooks.Signer
	canaries      []*canary
	logs          *syncBuffer
	Env           map[string]string // the sandbox's placeholders (worldOpts.envVars)
}

// worldOpts changes the default world.
type worldOpts struct {
	allowlist []allowlist.Entry // default: defaultEntries
	limits    func(*config.Limits)
	allow     []netip.Prefix // network.allow_cidrs
	unsafe    []netip.Prefix // network.unsafe_allow_cidrs
	proxyAddr string         // default 127.0.0.1:0
	// untrustedUpstream leaves the upstream's CA out of egressd's roots.
	untrustedUpstream bool
	// credentials are credential ID -> secret JSON, written to a credentials file.
	credentials map[string]string
	maxStale    time.Duration // credentials.max_stale; default 5m
	// envVars is the policy's env section (NAME -> credential ID): placeholders are
	// replaced (placeholder_test.go); the world's Env has the sandbox's variables.
	envVars map[string]string
	// hooksJSON, when set, is the hooks.json egressd recognises hook calls by.
	hooksJSON     string
	hookBodyBytes int64 // limits.hook_body_bytes
	// denyInTunnel answers refused CONNECTs inside TLS (tls.deny_in_tunnel).
	denyInTunnel bool
	intercept    allowlist.InterceptMode // tls.intercept; default auto
}

var defaultEntries = []allowlist.Entry{
	{Domain: "allowed.test"},
	{Domain: "*.allowed.test"},
	{Domain: "ports.test", Ports: []uint16{8443}},
}

func newWorld(t *testing.T, o worldOpts) *world {
	t.Helper()
	w := &world{t: t, logs: &syncBuffer{}, PublicIP: nextPublicIP()}
	w.startUpstream()
	w.canaries = startCanaries(t)
	w.startDNS()
	w.startProxy(o)
	return w
}

func (w *world) startUpstream() {
	w.Upstream = &echo{}
	plain := listenOn(w.t, w.PublicIP+":80")
	srv := &http.Server{Handler: w.Upstream}
	go srv.Serve(plain)
	ca := testpki.New(w.t)
	tlsSrv := httptest.NewUnstartedServer(w.Upstream)
	tlsSrv.Listener.Close()
	tlsSrv.Listener = listenOn(w.t, w.PublicIP+":443")
	tlsSrv.EnableHTTP2 = true
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{
		ca.Leaf(w.t, "allowed.test", "*.allowed.test", "ports.test", "other.test", w.PublicIP)}}
	tlsSrv.StartTLS()
	w.UpstreamCA, w.upstreamCAPEM, w.UpstreamPKI = ca.Pool, ca.PEM(), ca
	w.t.Cleanup(func() { srv.Close(); tlsSrv.Close() })
}

// The canaries are shared by every world in the process and live until it exits: a
// connection to any of them, from any test, fails the tests that check them.
var (
	canariesOnce sync.Once
	canaries     []*canary
)

func startCanaries(t *testing.T) []*canary {
	canariesOnce.Do(func() {
		for _, a := range canaryAddrs {
			canaries = append(canaries, startCanary(t, net.JoinHostPort(a, "80")))
		}
	})
	return canaries
}

func (w *world) startDNS() {
	w.DNS = dnsstub.Start(w.t)
	w.DNS.Set("allowed.test", "A "+w.PublicIP)
	w.DNS.Set("www.allowed.test", "A "+w.PublicIP)
	w.DNS.Set("api.allowed.test", "A "+w.PublicIP)
	w.DNS.Set("other.test", "A "+w.PublicIP)
	w.DNS.Set("ports.test", "A "+w.PublicIP)
	w.DNS.Set("loopback.allowed.test", "A 127.0.0.1")
	w.DNS.Set("metadata.allowed.test", "A 169.254.169.254")
	w.DNS.Set("private.allowed.test", "A 10.0.0.5")
	w.DNS.Set("cgnat.allowed.test", "A 100.64.0.5")
	w.DNS.Set("mixed.allowed.test", "A "+w.PublicIP, "A 10.0.0.5")
	w.DNS.Set("cname.allowed.test", "CNAME inside.elsewhere.test.")
	w.DNS.Set("inside.elsewhere.test", "A 10.0.0.5")
	w.DNS.Set("mapped.allowed.test", "AAAA ::ffff:127.0.0.1")
	w.DNS.Set("ula.allowed.test", "AAAA fd12::5")
	w.DNS.Set("v6meta.allowed.test", "AAAA fd00:ec2::254")
	w.DNS.SetFunc("rebind.allowed.test", func(n int) []string {
		if n == 0 {
			return []string{"A " + w.PublicIP}
		}
		return []string{"A 127.0.0.1"}
	})
}

func (w *world) startProxy(o worldOpts) {
	entries := o.allowlist
	if entries == nil {
		entries = defaultEntries
	}
	pol, err := allowlist.Compile(entries, allowlist.Options{Intercept: o.intercept})
	if err != nil {
		w.t.Fatal(err)
	}
	if o.proxyAddr == "" {
		o.proxyAddr = "127.0.0.1:0"
	}
	ln := listenOn(w.t, o.proxyAddr)
	self := netip.MustParseAddrPort(ln.Addr().String())
	guard, err := netguard.New(netguard.Options{AllowCIDRs: o.allow, UnsafeAllowCIDRs: o.unsafe, Self: []netip.AddrPort{self}})
	if err != nil {
		w.t.Fatal(err)
	}
	limits := config.Default().Limits
	if o.limits != nil {
		o.limits(&limits)
	}
	if o.hookBodyBytes != 0 {
		limits.HookBodyBytes = o.hookBodyBytes
	}
	roots := w.UpstreamCA
	if o.untrustedUpstream {
		roots = x509.NewCertPool()
	}
	snap := &proxy.Snapshot{
		Env: "env_test", Policy: pol, Guard: guard, Limits: limits,
		Resolver:     netguard.NewResolver(w.DNS.Addr, limits.DNS),
		UpstreamTLS:  &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DenyInTunnel: o.denyInTunnel,
	}
	log := zerolog.New(w.logs)
	snap.Leaves = w.interceptionCA()
	snap.Hooks = w.hooks(o)
	store := w.credentialStore(o, log)
	snap.Injector = inject.New(pol, store)
	if o.envVars != nil {
		snap.Placeholders = placeholder.New([]byte("world-test-placeholder-key-32byt"), "env_test", o.envVars, nil, store)
		w.Env = snap.Placeholders.Env()
	}
	snap.Prepare()
	w.Metrics = metrics.New()
	w.Server = proxy.New(snap, log, w.Metrics)
	store.Subscribe(w.Server.CredentialChanged) // as the daemon wires it
	w.ProxyAddr = ln.Addr().String()
	lc := config.Listener{Name: "sandbox", Address: self, Mode: "proxy", Role: "sandbox"}
	go w.Server.Serve(ln, lc)
	w.t.Cleanup(func() { w.Server.Shutdown(contextWithTimeout(w.t, 2*time.Second)); snap.Close() })
}

// hooks indexes o.hooksJSON and signs with a fresh key; w.Signer verifies.
func (w *world) hooks(o worldOpts) *proxy.Hooks {
	if o.hooksJSON == "" {
		return nil
	}
	f, err := hooks.Parse([]byte(o.hooksJSON))
	if err != nil {
		w.t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(nil)
	if w.Signer, err = hooks.NewSigner(key); err != nil {
		w.t.Fatal(err)
	}
	return &proxy.Hooks{Index: hooks.NewIndex(f), Signer: w.Signer, FailClosed: true}
}

// interceptionCA makes egressd's CA in a temporary state dir, as a first start does.
func (w *world) interceptionCA() *mitm.Leaves {
	ca, _, err := mitm.LoadOrCreateCA("", "", w.t.TempDir(), "env_test")
	if err != nil {
		w.t.Fatal(err)
	}
	w.CA, w.CAPool = ca, x509.NewCertPool()
	w.CAPool.AddCert(ca.Cert)
	return mitm.NewLeaves(ca, mitm.LeafOptions{})
}

// credentialStore writes o.credentials to a file and serves them with the file
// backend, polled fast so the tests see changes quickly.
func (w *world) credentialStore(o worldOpts, log zerolog.Logger) *credential.Store {
	doc := "{"
	ids := make([]string, 0, len(o.credentials))
	for id, secret := range o.credentials {
		if len(ids) > 0 {
			doc += ","
		}
		doc += `"` + id + `":` + secret
		ids = append(ids, id)
	}
	w.credFile = filepath.Join(w.t.TempDir(), "credentials.json")
	if err := os.WriteFile(w.credFile, []byte(doc+"}"), 0o600); err != nil {
		w.t.Fatal(err)
	}
	backend := file.New(w.credFile, file.Options{PollInterval: 20 * time.Millisecond, Log: log})
	store := credential.NewStore(backend, ids, credential.Options{MaxStale: o.maxStale, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	store.Start(ctx)
	w.t.Cleanup(func() { cancel(); store.Wait() })
	return store
}

// client returns an HTTP client that uses egressd as its explicit proxy and trusts
// the upstream's CA (CONNECT tunnels are end to end).
func (w *world) client() *http.Client {
	pu, _ := url.Parse("http://" + w.ProxyAddr)
	return &http.Client{
		Transport: &http.Transport{
			Proxy:           http.ProxyURL(pu),
			TLSClientConfig: &tls.Config{RootCAs: w.UpstreamCA},
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
}

// raw sends a raw request head (and body) to the proxy and returns the response.
func (w *world) raw(req string) *http.Response {
	w.t.Helper()
	c, err := net.DialTimeout("tcp", w.ProxyAddr, 2*time.Second)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		w.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		w.t.Fatalf("reading response to %q: %v", req, err)
	}
	return resp
}

// assertNoCanaryHit fails the test if any internal address saw a connection.
func (w *world) assertNoCanaryHit() {
	w.t.Helper()
	for _, c := range w.canaries {
		if n := c.accepts.Load(); n != 0 {
			w.t.Errorf("canary %s saw %d connection(s)", c.addr, n)
		}
	}
}

// logLines returns the canonical "egress" log lines written so far.
func (w *world) logLines() []map[string]any {
	var out []map[string]any
	for _, line := range bytes.Split(w.logs.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["message"] == "egress" {
			out = append(out, m)
		}
	}
	return out
}

// egressLines is the egress lines logged so far, one a line, for a failure message.
func (w *world) egressLines() string {
	var b strings.Builder
	for _, l := range w.logLines() {
		j, _ := json.Marshal(l)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// logWait bounds the wait for an egress line: a line is written when its request
// or connection ends, which on a loaded machine can come seconds after the event
// a test waits on. Only a line that never comes costs the whole wait.
const logWait = 10 * time.Second

// lastLog waits for the canonical line of req_id (or the last one when "").
func (w *world) lastLog(reqID string) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(logWait)
	for time.Now().Before(deadline) {
		lines := w.logLines()
		for i := len(lines) - 1; i >= 0; i-- {
			if reqID == "" || lines[i]["req_id"] == reqID {
				return lines[i]
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.t.Fatalf("no egress log line for %q", reqID)
	return nil
}

// waitLog waits for a canonical log line that match accepts.
func (w *world) waitLog(t *testing.T, match func(map[string]any) bool) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(logWait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, l := range w.logLines() {
			if match(l) {
				return l
			}
		}
	}
	t.Fatalf("no matching egress log line; the lines:\n%s", w.egressLines())
	return nil
}

// refusalBody is the JSON body of an egressd-made response.
type refusalBody struct {
	Error, Reason, Detail, Host, Message string
	Port                                 int
	RequestID                            string `json:"request_id"`
}

// assertRefused checks the status, the Egressd-Reason header, and the JSON body.
func assertRefused(t *testing.T, resp *http.Response, status int, reason, detail string) refusalBody {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var rb refusalBody
	if err := json.Unmarshal(body, &rb); err != nil {
		t.Fatalf("status %d, body not JSON: %q", resp.StatusCode, body)
	}
	if resp.StatusCode != status || resp.Header.Get("Egressd-Reason") != reason || rb.Reason != reason {
		t.Fatalf("got %d %q (body reason %q, detail %q); want %d %q", resp.StatusCode,
			resp.Header.Get("Egressd-Reason"), rb.Reason, rb.Detail, status, reason)
	}
	if detail != "" && rb.Detail != detail {
		t.Errorf("detail = %q, want %q", rb.Detail, detail)
	}
	if rb.RequestID == "" || rb.Message == "" {
		t.Errorf("body lacks request_id or message: %s", body)
	}
	return rb
}

// echo is the upstream: it answers with what it received, as JSON.
type echo struct {
	requests     atomic.Int64
	withoutToken atomic.Int64                     // requests to api.allowed.test without the injected token
	handler      atomic.Pointer[http.HandlerFunc] // optional override
}

type echoed struct {
	Method, Host, Path, Proto string
	Header                    http.Header
	Body                      string
}

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.requests.Add(1)
	if strings.HasPrefix(r.Host, "api.allowed.test") && r.Header.Get("Authorization") != "Bearer "+secretToken {
		e.withoutToken.Add(1)
	}
	if h := e.handler.Load(); h != nil {
		(*h)(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(echoed{r.Method, r.Host, r.URL.Path, r.Proto, markInjected(r.Header), markValues(string(body))})
}

// Marks for the injected values in what the echo upstream answers: egressd masks
// any injected value a response carries (scrub.go), so the echo names them by mark,
// and a value in a response the sandbox reads can only have come from egressd.
const (
	secretMark = "<SECRET>"
	staticMark = "<STATIC>"
)

func markValues(s string) string {
	return strings.NewReplacer(secretToken, secretMark, staticValue, staticMark).Replace(s)
}

func markInjected(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		for _, v := range vs {
			out[k] = append(out[k], markValues(v))
		}
	}
	return out
}

func (e *echo) set(h http.HandlerFunc) { e.handler.Store(&h) }

func decodeEcho(t *testing.T, resp *http.Response) echoed {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var e echoed
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	return e
}

// canary counts connections to an address nothing may reach.
type canary struct {
	addr    string
	accepts atomic.Int64
}

func startCanary(t *testing.T, addr string) *canary {
	c := &canary{addr: addr}
	host, _, _ := net.SplitHostPort(addr)
	if ip := netip.MustParseAddr(host); !ip.IsLoopback() {
		netns.AddLoopbackAddr(t, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.accepts.Add(1)
			conn.Close()
		}
	}()
	return c
}

// listenOn listens on addr, first adding its IP to the namespace's loopback.
func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	host, _, _ := net.SplitHostPort(addr)
	if ip := netip.MustParseAddr(host); !ip.IsLoopback() {
		netns.AddLoopbackAddr(t, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

type syncBuffer = syncbuf.Buffer
