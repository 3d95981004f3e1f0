package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckTypedCredentials: check parses every secret of the credentials file as the
// file backend does: a bad typed secret is an error naming the ID, the field and the fix;
// a revoked one a warning; no secret is printed.
func TestCheckTypedCredentials(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{
  "good": {"type": "bearer_token", "token": "` + demoToken + `", "header_name": "X-Api-Key", "prefix": ""},
  "oa": {"type": "oauth2", "client_id": "c", "client_secret": "` + demoToken + `", "token_url": "http://auth.test/t"},
  "gone": {"type": "bearer_token", "token": "` + demoToken + `", "status": "revoked"}
}`,
		"environment.json": `{"network": {"allowlist": [{"domain": "api.example.com", "credential": "good"}]}}`,
	})
	res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
	if res.code != 1 {
		t.Errorf("check: exit %d, want 1\n%s", res.code, res)
	}
	for _, want := range []string{
		`error: oa: credential oa: oauth2: "token_url" must be an https:// URL`,
		`warning: gone: credential gone: status is "revoked"`,
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("check output lacks %q\n%s", want, res)
		}
	}
	if strings.Contains(res.stdout, "good:") {
		t.Errorf("check reports the good secret\n%s", res)
	}
	if strings.Contains(res.all(), demoToken) {
		t.Errorf("check printed the secret:\n%s", res)
	}
}
