package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckVaultAuthFiles: `check` names each file a Vault login would read that is
// missing, unreadable (a directory: the tests run as root, which reads any mode) or
// empty, for every auth method, as a warning; a readable one is not named. The
// secret ID's content never appears in the report.
func TestCheckVaultAuthFiles(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"environment.json": `{"network": {"allowlist": [{"domain": "example.com"}]}}`,
		"role-id":          "role-1234\n",
		"secret-id":        "s3cret-id-value\n",
		"empty":            "\n",
		"token":            "hvs.token-value\n",
	})
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o700); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, auth, want string }{
		{"approle ok", "{method: approle, role_id_file: DIR/role-id, secret_id_file: DIR/secret-id}", ""},
		{"approle missing role id", "{method: approle, role_id_file: DIR/nope, secret_id_file: DIR/secret-id}", "role_id_file: open DIR/nope: no such file or directory"},
		{"approle unreadable secret id", "{method: approle, role_id_file: DIR/role-id, secret_id_file: DIR/adir}", "secret_id_file: read DIR/adir: is a directory"},
		{"approle empty secret id", "{method: approle, role_id_file: DIR/role-id, secret_id_file: DIR/empty}", "secret_id_file: DIR/empty is empty"},
		{"jwt missing", "{method: jwt, role: r, jwt_file: DIR/nope}", "jwt_file: open DIR/nope"},
		{"kubernetes default token", "{method: kubernetes, role: r}", "jwt_file: open /var/run/secrets/kubernetes.io/serviceaccount/token"},
		{"token file ok", "{method: token, token_file: DIR/token}", ""},
		{"token file missing", "{method: token, token_file: DIR/nope}", "token_file: open DIR/nope"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := strings.ReplaceAll(`version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
policy: {file: DIR/environment.json}
credentials: {backend: vault, vault: {address: "http://127.0.0.1:1", auth: `+c.auth+`}}
state_dir: DIR/state
`, "DIR", dir)
			path := filepath.Join(dir, "egressd.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			res := egressd(t, "check", "--format", "json", "--config", path)
			rep := decodeCheck(t, res)
			var got []string
			for _, p := range rep.Problems {
				if strings.HasPrefix(*p.Path, "credentials.vault.auth.") {
					got = append(got, strings.TrimPrefix(*p.Path, "credentials.vault.auth.")+": "+p.Message)
					if !p.Warning {
						t.Errorf("%s: an error, want a warning (the file may exist only where egressd runs)", *p.Path)
					}
				}
			}
			want := strings.ReplaceAll(c.want, "DIR", dir)
			switch {
			case want == "" && len(got) != 0:
				t.Errorf("check named %q; the files are readable", got)
			case want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], want)):
				t.Errorf("check named %q, want one problem starting %q", got, want)
			}
			if strings.Contains(res.stdout, "s3cret-id-value") || strings.Contains(res.stdout, "hvs.token-value") {
				t.Errorf("check printed a secret:\n%s", res.stdout)
			}
		})
	}
}
