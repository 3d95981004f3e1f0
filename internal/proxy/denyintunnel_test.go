package proxy_test

import (
	"bufio"
	"crypto/tls"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
)

// Explicit-mode denials the agent can read (tls.deny_in_tunnel): a refused CONNECT
// is answered 200 carrying Egressd-Reason, TLS is completed with egressd's leaf for
// the requested name, and the first request inside gets the refusal and its JSON
// body. Real clients (Go, curl, Python requests and urllib, pip) show the reason;
// no upstream and no canary sees a byte.

// deniedTargets are refused CONNECTs, each for another reason; metadata.allowed.test
// resolves to 169.254.169.254, whose canary listens on port 80.
var deniedTargets = []struct{ url, reason, detail string }{
	{"https://evil.test/x", "not_allowlisted", ""},
	{"https://ports.test/x", "port_not_allowed", ""},
	{"https://metadata.allowed.test:80/x", "internal_address", "metadata"},
}

func TestDenyInTunnelGoClient(t *testing.T) {
	w := newWorld(t, worldOpts{denyInTunnel: true})
	for _, h2 := range []bool{false, true} {
		c := w.interceptingClient()
		c.Transport.(*http.Transport).ForceAttemptHTTP2 = h2
		for _, d := range deniedTargets {
			resp, err := c.Get(d.url)
			if err != nil {
				t.Fatalf("h2=%v %s: %v", h2, d.url, err)
			}
			assertRefused(t, resp, statusOf(d.reason), d.reason, d.detail)
			if h2 != (resp.ProtoMajor == 2) {
				t.Errorf("%s: served over %s", d.url, resp.Proto)
			}
		}
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	w.assertNoCanaryHit()
	l := w.waitLog(t, func(m map[string]any) bool { return m["method"] == "CONNECT" && m["host"] == "evil.test" })
	if l["reason"] != "not_allowlisted" || l["decision"] != "deny" {
		t.Errorf("CONNECT logged as %v/%v", l["decision"], l["reason"])
	}
}

func statusOf(reason string) int {
	if reason == "not_allowlisted" || reason == "port_not_allowed" || reason == "internal_address" {
		return http.StatusForbidden
	}
	return http.StatusBadGateway
}

// TestDenyInTunnelWire checks the exchange byte for byte: the 200 carries the
// reason, the leaf names the CONNECT host, the refusal announces the close and the
// connection then closes; plain HTTP sent into the tunnel gets the same refusal in
// plain HTTP, and nothing after it is read.
func TestDenyInTunnelWire(t *testing.T) {
	w := newWorld(t, worldOpts{denyInTunnel: true})
	nc := w.connectRefused(t, "evil.test:443")
	tc := tls.Client(nc, &tls.Config{ServerName: "evil.test", RootCAs: w.CAPool, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake with egressd's leaf: %v", err)
	}
	io.WriteString(tc, "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Close {
		t.Error("the refusal inside the tunnel does not announce Connection: close")
	}
	assertRefused(t, resp, 403, "not_allowlisted", "")
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Error("the connection stayed open after the refusal")
	}

	// Plain HTTP sent into a refused tunnel (undici sends http:// URLs so) gets the
	// refusal in plain HTTP, then the connection closes; nothing is forwarded.
	nc = w.connectRefused(t, "evil.test:80")
	br := bufio.NewReader(nc)
	io.WriteString(nc, "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\nGET /y HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if resp, err = http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	}
	if !resp.Close {
		t.Error("the plain refusal does not announce Connection: close")
	}
	assertRefused(t, resp, 403, "not_allowlisted", "")
	if n, err := br.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes after the refusal, want the connection closed", n)
	}
	if w.Upstream.requests.Load() != 0 {
		t.Error("the upstream saw a request")
	}
}

// connectRefused sends a CONNECT to authority and checks the 200 carries Egressd-Reason.
func (w *world) connectRefused(t *testing.T, authority string) net.Conn {
	t.Helper()
	nc, resp := w.connectResp(t, authority)
	if resp.Header.Get("Egressd-Reason") != "not_allowlisted" {
		t.Fatalf("CONNECT %s: 200 with Egressd-Reason %q", authority, resp.Header.Get("Egressd-Reason"))
	}
	return nc
}

// TestDenyInTunnelNever keeps the plain refusal in place of the 200.
func TestDenyInTunnelNever(t *testing.T) {
	w := newWorld(t, worldOpts{})
	resp := w.raw("CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
	assertRefused(t, resp, 403, "not_allowlisted", "")
}

// TestDenyInTunnelHookCall: a pre-tool hook call to a denied host still gets its
// fail-closed deny, not the 403.
func TestDenyInTunnelHookCall(t *testing.T) {
	w := newWorld(t, worldOpts{allowlist: hookEntries, hooksJSON: hooksJSON, credentials: map[string]string{},
		denyInTunnel: true})
	status, body, _ := w.hookCall(t, "https://evil.test/pre")
	if status != 200 || body["decision"] != "deny" {
		t.Fatalf("hook call through a refused tunnel: %d %v", status, body)
	}
}

// TestDenyInTunnelClients runs the clients agents use. Each must show the reason.
func TestDenyInTunnelClients(t *testing.T) {
	w := newWorld(t, worldOpts{denyInTunnel: true})
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.CA.Cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	proxyURL := "http://" + w.ProxyAddr
	py := `import sys, urllib.request, ssl
ctx = ssl.create_default_context(cafile=sys.argv[1])
op = urllib.request.build_opener(urllib.request.ProxyHandler({"https": sys.argv[2]}), urllib.request.HTTPSHandler(context=ctx))
try:
    op.open(sys.argv[3], timeout=10)
except urllib.error.HTTPError as e:
    print(e.code, e.headers["Egressd-Reason"], e.read().decode())`
	pyRequests := `import sys, requests
r = requests.get(sys.argv[3], proxies={"https": sys.argv[2]}, verify=sys.argv[1], timeout=10)
print(r.status_code, r.headers["Egressd-Reason"], r.text)`
	clients := []struct {
		name string
		argv []string
		want []string
	}{
		{"curl", []string{"curl", "-sS", "-v", "--cacert", ca, "-x", proxyURL, "https://evil.test/x"},
			[]string{"Egressd-Reason: not_allowlisted", `"reason":"not_allowlisted"`}},
		{"python urllib", []string{"python3", "-c", py, ca, proxyURL, "https://evil.test/x"},
			[]string{"403 not_allowlisted", `"reason":"not_allowlisted"`}},
		{"python requests", []string{"python3", "-c", pyRequests, ca, proxyURL, "https://evil.test/x"},
			[]string{"403 not_allowlisted", `"reason":"not_allowlisted"`}},
		{"pip", []string{"python3", "-m", "pip", "download", "--isolated", "--no-cache-dir", "--no-deps",
			"--retries", "0", "--timeout", "10", "--proxy", proxyURL, "--cert", ca,
			"-d", dir, "https://evil.test/somepackage-1.0-py3-none-any.whl"},
			[]string{"403 Client Error: Forbidden (egressd: not_allowlisted)"}},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			if _, err := exec.LookPath(c.argv[0]); err != nil {
				t.Skipf("%s not installed", c.argv[0])
			}
			if c.name == "python requests" && exec.Command("python3", "-c", "import requests").Run() != nil {
				t.Skip("requests not installed")
			}
			if c.name == "pip" && exec.Command("python3", "-m", "pip", "--version").Run() != nil {
				t.Skip("pip not installed")
			}
			cmd := exec.Command(c.argv[0], c.argv[1:]...)
			cmd.Env = clientEnv(ca)
			out, _ := cmd.CombinedOutput()
			t.Logf("%s", out)
			for _, want := range c.want {
				if !strings.Contains(string(out), want) {
					t.Errorf("%s output lacks %q:\n%s", c.name, want, out)
				}
			}
		})
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
	w.assertNoCanaryHit()
}

// clientEnv is the environment `egressd ca env` gives a sandbox, pointing every
// client's CA bundle at ca, without this machine's own proxy and CA settings.
func clientEnv(ca string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PIP_") || strings.Contains(strings.ToUpper(name), "PROXY") ||
			strings.Contains(name, "CA_BUNDLE") || strings.HasPrefix(name, "SSL_CERT") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "SSL_CERT_FILE="+ca, "REQUESTS_CA_BUNDLE="+ca, "CURL_CA_BUNDLE="+ca, "PIP_CERT="+ca,
		"PIP_CONFIG_FILE=/dev/null")
}

// TestDenyInTunnelUnnameableTarget: where no leaf could name the CONNECT target as
// the client spelled it (a non-canonical IPv4 spelling, a non-ASCII name), a leaf
// would only show the client a certificate error; the refusal replaces the 200, so
// the reason is readable. A canonical spelling is still answered inside TLS.
func TestDenyInTunnelUnnameableTarget(t *testing.T) {
	w := newWorld(t, worldOpts{denyInTunnel: true, allowlist: []allowlist.Entry{{Domain: "*.allowed.test"}, {Domain: "*"}}})
	cases := []struct {
		authority, reason, detail string
		status                    int
	}{
		{"2130706433:80", "internal_address", "loopback", 403},
		{"0x7f.0.0.1:80", "internal_address", "loopback", 403},
		{"0177.0.0.1:80", "internal_address", "loopback", 403},
		{"127.1:80", "internal_address", "loopback", 403},
		{"\uff11\uff12\uff17.0.0.1:80", "internal_address", "loopback", 403}, // fullwidth digits
		{"b\u00fccher.allowed.test:443", "dns_failure", "", 502},
	}
	for _, tc := range cases {
		t.Run(tc.authority, func(t *testing.T) {
			resp := w.raw("CONNECT " + tc.authority + " HTTP/1.1\r\nHost: " + tc.authority + "\r\n\r\n")
			assertRefused(t, resp, tc.status, tc.reason, tc.detail)
		})
	}
	w.assertNoCanaryHit()
	t.Run("canonical spelling", func(t *testing.T) {
		_, resp := w.connectResp(t, "127.0.0.1:80")
		if resp.StatusCode != 200 || resp.Header.Get("Egressd-Reason") != "internal_address" {
			t.Errorf("CONNECT 127.0.0.1:80: %s with Egressd-Reason %q, want 200 and the refusal inside TLS",
				resp.Status, resp.Header.Get("Egressd-Reason"))
		}
	})
}
