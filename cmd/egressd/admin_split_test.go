package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// TestRunAdminSplit: with admin.address on a Unix socket and admin.health_address
// on TCP, probes and Prometheus get /healthz, /readyz and /metrics on the health
// listener and nothing else from it; reload and the sandbox's placeholders are on
// the socket alone, which only egressd's own user may open (0600).
func TestRunAdminSplit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "admin.sock")
	e := egressdtest.StartT(t, egressdtest.Options{Dir: dir, Wait: egressdtest.WaitReady, RawConfig: fmt.Sprintf(`version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "unix://%s", health_address: "127.0.0.1:0"}
policy: {allowlist: [{domain: localhost}]}
credentials: {backend: file, file: credentials.json}
state_dir: state
`, sock), Files: map[string]string{"credentials.json": `{}`}})
	if e.Admin != "unix://"+sock || e.Addrs["health"] == "" {
		t.Fatalf("listening: admin %q, health %q", e.Admin, e.Addrs["health"])
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin socket: %v, mode %v; want 0600", err, fi.Mode())
	}
	health := "http://" + e.Addrs["health"]
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if code := httpGet(t, health+path); code != http.StatusOK {
			t.Errorf("health listener GET %s = %d, want 200", path, code)
		}
	}
	for _, path := range []string{"/v1/sandbox/env", "/ca.pem", "/v1/explain?url=http://localhost/", "/.well-known/jwks.json"} {
		if code := httpGet(t, health+path); code != http.StatusNotFound {
			t.Errorf("health listener GET %s = %d, want 404", path, code)
		}
	}
	if res, err := http.Post(health+"/v1/reload", "application/json", nil); err != nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("health listener POST /v1/reload: %v %v, want 404", res, err)
	}
	if code, body, err := e.AdminPost("/v1/reload"); err != nil || code != http.StatusOK {
		t.Errorf("admin socket POST /v1/reload: %d %v %s", code, err, body)
	}
	if code, _, err := e.AdminGet("/v1/sandbox/env"); err != nil || code != http.StatusOK {
		t.Errorf("admin socket GET /v1/sandbox/env: %d %v", code, err)
	}
	e.Admin = "unix://" + sock // health paths: the admin socket no longer serves them
	delete(e.Addrs, "health")
	if code, _, err := e.AdminGet("/metrics"); err != nil || code != http.StatusNotFound {
		t.Errorf("admin socket GET /metrics: %d %v, want 404 (health has its own listener)", code, err)
	}
}

// TestRunAdminToken: with admin.token every admin request needs the Bearer token.
func TestRunAdminToken(t *testing.T) {
	t.Parallel()
	const token = "adm-PLANTED-7731"
	e := egressdtest.StartT(t, egressdtest.Options{Wait: egressdtest.WaitStarted, RawConfig: `version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0", token: {file: admin-token}}
policy: {allowlist: [{domain: localhost}]}
credentials: {backend: file, file: credentials.json}
state_dir: state
`, Files: map[string]string{"credentials.json": `{}`, "admin-token": token + "\n"}})
	for _, path := range []string{"/healthz", "/v1/sandbox/env", "/metrics"} {
		if code := httpGet(t, "http://"+e.Admin+path); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token = %d, want 401", path, code)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.Admin+"/v1/reload", strings.NewReader(""))
	req.Header.Set("Authorization", "Bearer "+token)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("POST /v1/reload with the token: %v %v", res, err)
	}
}

func httpGet(t *testing.T, u string) int {
	t.Helper()
	res, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Get(u)
	if err != nil {
		t.Errorf("GET %s: %v", u, err)
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// TestCheckAdminTokenFile: check reports an admin.token file run could not read.
func TestCheckAdminTokenFile(t *testing.T) {
	dir := writeFiles(t, map[string]string{"egressd.yaml": `version: 1
listeners: [{name: sandbox, address: 127.0.0.1:15001}]
admin: {address: 127.0.0.1:15000, token: {file: missing-token}}
policy: {allowlist: [{domain: example.com}]}
credentials: {file: credentials.json}
`, "credentials.json": `{}`})
	res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
	if res.code != 1 || !strings.Contains(res.stdout, "error: admin.token.file: cannot read the admin token") {
		t.Errorf("check with an admin.token file that does not exist: %s\nwant exit 1 and the error", res)
	}
}
