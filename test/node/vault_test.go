package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// vault is the test's own Vault dev server (internal/testutil/vaultdev) and a
// root client for it.
type vault struct {
	*vaultdev.Server
	addr string
	hc   *http.Client
}

// startVault runs the binary `scripts/vaultdev.sh build` prints. Without it the
// test skips, unless EGRESSD_REQUIRE_VAULT=1 (make test), when it fails.
func startVault(t *testing.T) *vault {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	bin, err := vaultdev.Build(ctx, "../../scripts/vaultdev.sh")
	if err != nil {
		if os.Getenv("EGRESSD_REQUIRE_VAULT") == "1" {
			t.Fatalf("EGRESSD_REQUIRE_VAULT=1 but there is no Vault dev server binary: %v", err)
		}
		t.Skipf("no Vault dev server binary (EGRESSD_REQUIRE_VAULT=1 makes this a failure): %v", err)
	}
	srv, err := vaultdev.Start(ctx, bin, t.TempDir(), "error")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Stop()
		if t.Failed() {
			t.Logf("vault's log:\n%s", srv.Log(4000))
		}
	})
	return &vault{Server: srv, addr: srv.Addr, hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}}
}

// must calls Vault's API with the root token and returns the response's data.
func (v *vault) must(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, v.addr+"/v1/"+path, bytes.NewReader(b))
	req.Header.Set("X-Vault-Token", v.RootToken)
	resp, err := v.hc.Do(req)
	if err != nil {
		t.Fatalf("vault %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNoContent {
		t.Fatalf("vault %s %s: %d %v", method, path, resp.StatusCode, out["errors"])
	}
	return out
}

// scopedToken is a token that may read the KV secrets under prefix and nothing
// else: the node's.
func (v *vault) scopedToken(t *testing.T, prefix string) string {
	t.Helper()
	v.must(t, "PUT", "sys/policies/acl/egressd-node", map[string]any{
		"policy": fmt.Sprintf(`path "secret/data/%s" { capabilities = ["read"] }`, prefix)})
	out := v.must(t, "POST", "auth/token/create", map[string]any{"policies": []string{"egressd-node"}, "ttl": "1h"})
	auth, _ := out["auth"].(map[string]any)
	token, _ := auth["client_token"].(string)
	if token == "" {
		t.Fatalf("vault made no token: %v", out)
	}
	return token
}

// putSandboxSecrets writes sandbox id's credentials under its prefix, "key" (a
// bearer token) and "ph" (an environment_variable for shared.test), and returns
// key's secret; ph's is it with "-ph".
func (v *vault) putSandboxSecrets(t *testing.T, id string) string {
	t.Helper()
	secret := "vault-" + id + "-" + randomToken(t)
	base := filepath.Join("secret/data/egressd/sandboxes", id)
	v.must(t, "POST", base+"/key", map[string]any{"data": map[string]any{"token": secret}})
	v.must(t, "POST", base+"/ph", map[string]any{"data": map[string]any{"type": "environment_variable", "value": secret + "-ph",
		"injection_location": "header", "trusted_domains": []string{"shared.test"}}})
	return secret
}
