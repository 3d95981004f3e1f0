package proxy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
)

// TestClientUntrustedCA: a client that rejects egressd's leaf (it does not trust
// egressd's CA) is logged with detail client_untrusted_ca and a hint naming `egressd
// ca env`, not as a bare TLS error that reads as corruption. Go's client sends the
// alert bad_certificate, curl (OpenSSL) unknown_ca.
func TestClientUntrustedCA(t *testing.T) {
	w := newWorld(t, worldOpts{allowlist: []allowlist.Entry{
		{Domain: "api.allowed.test", Transform: []allowlist.Header{{Name: "X-Demo", Value: "v"}}}}})
	upstreamCA := filepath.Join(t.TempDir(), "upstream.pem")
	os.WriteFile(upstreamCA, w.upstreamCAPEM, 0o600)
	clients := map[string]func(){
		"go": func() {
			if _, err := w.client().Get("https://api.allowed.test/go"); err == nil {
				t.Error("a client that trusts only the upstream's CA accepted egressd's leaf")
			}
		},
		"curl": func() {
			if _, err := exec.LookPath("curl"); err != nil {
				t.Log("curl not installed")
				return
			}
			out, err := exec.Command("curl", "-sS", "--cacert", upstreamCA, "-x", "http://"+w.ProxyAddr,
				"https://api.allowed.test/curl").CombinedOutput()
			if err == nil {
				t.Errorf("curl accepted egressd's leaf: %s", out)
			}
		},
	}
	clients["python"] = func() {
		py := `import sys, requests
requests.get("https://api.allowed.test/py", proxies={"https": sys.argv[1]}, verify=sys.argv[2], timeout=10)`
		if exec.Command("python3", "-c", "import requests").Run() != nil {
			t.Log("python requests not installed")
			return
		}
		cmd := exec.Command("python3", "-c", py, "http://"+w.ProxyAddr, upstreamCA)
		cmd.Env = clientEnv(upstreamCA)
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("requests accepted egressd's leaf: %s", out)
		}
	}
	seen := map[string]bool{}
	for name, run := range clients {
		t.Run(name, func(t *testing.T) {
			run()
			l := w.waitLog(t, func(m map[string]any) bool {
				return m["method"] == "CONNECT" && m["detail"] != "" && m["detail"] != nil &&
					strings.Contains(m["error"].(string), "api.allowed.test") && !seen[m["req_id"].(string)]
			})
			seen[l["req_id"].(string)] = true
			if l["reason"] != "bad_request" || l["detail"] != "client_untrusted_ca" ||
				!strings.Contains(l["error"].(string), "egressd ca env") {
				t.Errorf("logged reason %v detail %v error %q; want bad_request, client_untrusted_ca and the hint",
					l["reason"], l["detail"], l["error"])
			}
		})
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}
