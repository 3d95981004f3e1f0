package proxy_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
)

// These tests hold a connection open across a change of state, with bytes flowing
// before and after: a reload (Server.Swap, as the daemon calls it) or a credential
// read. What the new state still allows stays up; what it refuses is closed within
// endWithin and logged with the new reason and detail policy_reload.

// endWithin is how soon a refused open connection must be closed.
const endWithin = time.Second

// runtimeWith is a Snapshot like the running one with entries as its allowlist and,
// when not nil, guard as its address guard: what a reload of the policy builds.
func (w *world) runtimeWith(t *testing.T, entries []allowlist.Entry, guard *netguard.Guard) *proxy.Snapshot {
	t.Helper()
	old := w.Server.Snapshot()
	pol, err := allowlist.Compile(entries, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if guard == nil {
		guard = old.Guard
	}
	snap := &proxy.Snapshot{
		Env: old.Env, Policy: pol, Guard: guard, Resolver: old.Resolver, Limits: old.Limits,
		UpstreamTLS: old.UpstreamTLS, Injector: inject.New(pol, old.Injector.Credentials()),
		Leaves: old.Leaves, Hooks: old.Hooks, Placeholders: old.Placeholders, DenyInTunnel: old.DenyInTunnel,
	}
	snap.Prepare()
	t.Cleanup(snap.Close)
	return snap
}

// reload swaps in runtimeWith(entries, guard).
func (w *world) reload(t *testing.T, entries []allowlist.Entry, guard *netguard.Guard) {
	t.Helper()
	w.Server.Swap(w.runtimeWith(t, entries, guard))
}

// echoOn sends GET path for host on an HTTP/1.1 connection and checks that the
// echo upstream answered it.
func echoOn(t *testing.T, c net.Conn, br *bufio.Reader, host, path string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if got := decodeEcho(t, resp); got.Path != path {
		t.Fatalf("GET %s: the upstream echoed %q", path, got.Path)
	}
}

// assertEnded checks that egressd closes c within endWithin: a read ends in EOF or
// an error, not in the deadline.
func assertEnded(t *testing.T, c net.Conn) {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(endWithin))
	_, err := io.Copy(io.Discard, c)
	if isTimeoutErr(err) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("still open %v after the change of state", endWithin)
	}
}

// endedLine waits for the egress line of the open connection to host that ended
// (its status: 200 for a tunnel, 101 for an upgrade) and checks that it names
// reason with detail policy_reload, and that it was counted so.
func (w *world) endedLine(t *testing.T, listener, host string, status int, decision, reason string) map[string]any {
	t.Helper()
	l := w.waitLog(t, func(l map[string]any) bool { return l["host"] == host && l["status"] == float64(status) })
	if l["decision"] != decision || l["reason"] != reason || l["detail"] != "policy_reload" {
		t.Errorf("line of the ended connection: decision %v, reason %v, detail %v; want %s, %s, policy_reload",
			l["decision"], l["reason"], l["detail"], decision, reason)
	}
	if n := w.requestsTotal(t, listener, decision, reason); n != 1 {
		t.Errorf("requests_total{%s,%s,%s} = %v, want 1", listener, decision, reason, n)
	}
	if n := w.Server.OpenConns(); n != 0 {
		t.Errorf("%d connections still registered after the last one ended", n)
	}
	return l
}

// requestsTotal reads egressd_requests_total{listener,decision,reason}.
func (w *world) requestsTotal(t *testing.T, listener, decision, reason string) float64 {
	t.Helper()
	families, err := w.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"listener": listener, "decision": decision, "reason": reason}
	for _, f := range families {
		if f.GetName() != "egressd_requests_total" {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestReloadEndsRefusedTunnel: a spliced CONNECT tunnel stays up, bytes flowing,
// across a reload that keeps its host, and is closed within a second of one that
// removes the host, or the port; its line names the new reason with detail
// policy_reload, and it leaves the registry.
func TestReloadEndsRefusedTunnel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refusing []allowlist.Entry
		reason   string
	}{
		{"host removed", []allowlist.Entry{{Domain: "other.test"}}, "not_allowlisted"},
		{"port removed", []allowlist.Entry{{Domain: "allowed.test", Ports: []uint16{8443}}}, "port_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, worldOpts{})
			c, br := w.tlsH1(t, "allowed.test", w.UpstreamCA)
			echoOn(t, c, br, "allowed.test", "/before")
			if n := w.Server.OpenConns(); n != 1 {
				t.Errorf("%d connections registered with one tunnel open", n)
			}
			w.reload(t, []allowlist.Entry{{Domain: "allowed.test"}}, nil)
			echoOn(t, c, br, "allowed.test", "/kept")
			w.reload(t, tc.refusing, nil)
			assertEnded(t, c)
			l := w.endedLine(t, "sandbox", "allowed.test", 200, "deny", tc.reason)
			if l["method"] != "CONNECT" || l["bytes_out"] == float64(0) {
				t.Errorf("line of the ended tunnel: %v", l)
			}
		})
	}
}

// TestReloadEndsTunnelToClosedRange: the address guard is decided again too: a
// tunnel to a private address that network.allow_cidrs opened is closed by a
// reload that closes the range (internal_address, detail policy_reload).
func TestReloadEndsTunnelToClosedRange(t *testing.T) {
	const inside = "10.77.0.5"
	w := newWorld(t, worldOpts{allow: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/16")}})
	srv := httptest.NewUnstartedServer(w.Upstream)
	srv.Listener.Close()
	srv.Listener = listenOn(t, inside+":443")
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{w.UpstreamPKI.Leaf(t, "inside.allowed.test")}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	w.DNS.Set("inside.allowed.test", "A "+inside)

	c, br := w.tlsH1(t, "inside.allowed.test", w.UpstreamCA)
	echoOn(t, c, br, "inside.allowed.test", "/before")
	w.reload(t, defaultEntries, nil) // the same guard: kept
	echoOn(t, c, br, "inside.allowed.test", "/kept")
	closed, err := netguard.New(netguard.Options{Self: []netip.AddrPort{netip.MustParseAddrPort(w.ProxyAddr)}})
	if err != nil {
		t.Fatal(err)
	}
	w.reload(t, defaultEntries, closed)
	assertEnded(t, c)
	l := w.endedLine(t, "sandbox", "inside.allowed.test", 200, "deny", "internal_address")
	if !strings.Contains(l["error"].(string), "private") {
		t.Errorf("error %q; want the address class", l["error"])
	}
}

// wsEchoAll serves a WebSocket upstream that echoes every message until the end.
func wsEchoAll(rw http.ResponseWriter, r *http.Request) {
	websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }).ServeHTTP(rw, r)
}

// wsRoundTrip sends msg and checks that it comes back.
func wsRoundTrip(t *testing.T, ws *websocket.Conn, msg string) {
	t.Helper()
	ws.SetDeadline(time.Now().Add(5 * time.Second))
	if err := websocket.Message.Send(ws, msg); err != nil {
		t.Fatalf("send %q: %v", msg, err)
	}
	var got string
	if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// TestReloadEndsRefusedWebSocket: a WebSocket in an intercepted tunnel, carrying
// the injected credential, stays up across a reload that keeps its host and is
// closed within a second of one that removes it.
func TestReloadEndsRefusedWebSocket(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.Upstream.set(wsEchoAll)
	ws := w.websocket(t, nil)
	wsRoundTrip(t, ws, "before")
	w.reload(t, injectEntries[:1], nil) // api.allowed.test, with its credential
	wsRoundTrip(t, ws, "kept")
	w.reload(t, []allowlist.Entry{{Domain: "other.test"}}, nil)
	assertEnded(t, ws)
	l := w.endedLine(t, "sandbox", "api.allowed.test", 101, "deny", "not_allowlisted")
	if l["credential"] != "api" {
		t.Errorf("line of the ended WebSocket: %v", l)
	}
}

// writeCredentials replaces the world's credentials file (polled every 20 ms) at
// once, as a careful tool does. It may run off the test's goroutine.
func (w *world) writeCredentials(doc string) error {
	tmp := w.credFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, w.credFile)
}

// waitCredential waits until the store serves credential id as ok says.
func (w *world) waitCredential(id string, ok func(version string, err error) bool) bool {
	creds := w.Server.Snapshot().Injector.Credentials()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if v, err := creds.Get(id); ok(v.Version, err) {
			return true
		}
	}
	return false
}

// TestRevocationEndsWebSocket: with no reload at all, a WebSocket carrying a
// credential stays up across a rotation of it and is closed within a second of its
// revocation in the backend (credential_unavailable, detail policy_reload).
func TestRevocationEndsWebSocket(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	w.Upstream.set(wsEchoAll)
	ws := w.websocket(t, nil)
	wsRoundTrip(t, ws, "before")
	v0, _ := w.Server.Snapshot().Injector.Credentials().Get("api")
	if err := w.writeCredentials(`{"api": {"token": "tok-rotated-2"}}`); err != nil {
		t.Fatal(err)
	}
	if !w.waitCredential("api", func(v string, err error) bool { return err == nil && v != v0.Version }) {
		t.Fatal("the rotation was never read")
	}
	wsRoundTrip(t, ws, "kept")
	if err := w.writeCredentials(`{"api": {"token": "tok-rotated-2", "status": "revoked"}}`); err != nil {
		t.Fatal(err)
	}
	assertEnded(t, ws)
	l := w.endedLine(t, "sandbox", "api.allowed.test", 101, "error", "credential_unavailable")
	if l["credential"] != "api" || !strings.Contains(l["error"].(string), "revoked") {
		t.Errorf("line of the ended WebSocket: %v", l)
	}
}

// openWebSocket is websocket that reports a failed handshake instead of failing.
func (w *world) openWebSocket(t *testing.T) (*websocket.Conn, net.Conn, error) {
	t.Helper()
	tc, _ := w.interceptedH1(t, "api.allowed.test")
	conf, err := websocket.NewConfig("wss://api.allowed.test/ws", "https://api.allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	ws, err := websocket.NewClient(conf, tc)
	return ws, tc, err
}

// TestSwapOrRevocationDuringUpgrade: a change of state that lands while an upgrade is on its
// way (decided and forwarded, the upstream not yet answered) finds no open
// connection to decide, and still reaches it: the upgrade is decided once more as
// it opens, and closed.
func TestSwapOrRevocationDuringUpgrade(t *testing.T) {
	for _, tc := range []struct {
		name, decision, reason string
		change                 func(t *testing.T, w *world) func()
	}{
		{"reload", "deny", "not_allowlisted", func(t *testing.T, w *world) func() {
			snap := w.runtimeWith(t, []allowlist.Entry{{Domain: "other.test"}}, nil)
			return func() { w.Server.Swap(snap) }
		}},
		{"revocation", "error", "credential_unavailable", func(t *testing.T, w *world) func() {
			return func() {
				if w.writeCredentials(`{"api": {"token": "`+secretToken+`", "status": "revoked"}}`) == nil {
					w.waitCredential("api", func(_ string, err error) bool { return err != nil })
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newInjectWorld(t, worldOpts{})
			var once sync.Once
			change := tc.change(t, w)
			w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
				once.Do(change)
				wsEchoAll(rw, r)
			})
			ws, raw, err := w.openWebSocket(t)
			if err == nil {
				defer ws.Close()
			}
			assertEnded(t, raw)
			w.endedLine(t, "sandbox", "api.allowed.test", 101, tc.decision, tc.reason)
		})
	}
}

// TestReloadEndsRefusedTransparentTunnel: a spliced tunnel on a transparent
// listener is decided again as it was admitted: on its SNI, or, without SNI, on
// its original destination, which only an entry naming the address allows ("*"
// does not).
func TestReloadEndsRefusedTransparentTunnel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sniless   bool // the ClientHello names the upstream's address, which Go sends as no SNI
		admitting []allowlist.Entry
		kept      []allowlist.Entry
		refusing  []allowlist.Entry
	}{
		{"by SNI", false, injectEntries[:2], []allowlist.Entry{{Domain: "*.allowed.test"}}, injectEntries[:1]},
		{"without SNI", true, []allowlist.Entry{{Domain: "$ip"}},
			[]allowlist.Entry{{Domain: "$ip"}, {Domain: "*"}}, []allowlist.Entry{{Domain: "*"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, sb := newTransparentWorld(t)
			ip := w.PublicIP
			for _, es := range [][]allowlist.Entry{tc.admitting, tc.kept, tc.refusing} {
				for i := range es {
					es[i].Domain = strings.ReplaceAll(es[i].Domain, "$ip", ip)
				}
			}
			sni := "www.allowed.test"
			if tc.sniless {
				sni = ip
			}
			w.reload(t, tc.admitting, nil)
			c, err := w.tlsFromSandbox(t, sb, ip+":443", sni)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			echoOn(t, c, br, sni, "/before")
			w.reload(t, tc.kept, nil)
			echoOn(t, c, br, sni, "/kept")
			w.reload(t, tc.refusing, nil)
			assertEnded(t, c)
			l := w.endedLine(t, "transparent", sni, 0, "deny", "not_allowlisted")
			if l["scheme"] != "tls" || l["intercepted"] != false {
				t.Errorf("line of the ended tunnel: %v", l)
			}
		})
	}
}
