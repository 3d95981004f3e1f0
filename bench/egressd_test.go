package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogSummary(t *testing.T) {
	lines := []string{
		`{"level":"info","req_id":"a-1","method":"GET","scheme":"http","decision":"allow","reason":"","status":200,"error":"","message":"egress"}`,
		`{"level":"info","req_id":"a-2","method":"CONNECT","scheme":"connect","decision":"allow","reason":"","status":200,"scrubbed":0,"error":"","message":"egress"}`,
		`{"level":"info","req_id":"a-5","method":"GET","scheme":"https","decision":"allow","reason":"","status":200,"scrubbed":1,"error":"","message":"egress"}`,
		`{"level":"warn","rule":"cred.bench.test","credential":"bench-cred","message":"an upstream reflected a value egressd injected; it was masked in the response"}`,
		`{"level":"info","req_id":"a-3","method":"GET","scheme":"http","decision":"error","reason":"upstream_unreachable","status":502,"error":"dial tcp 127.0.0.1:4242: connect: connection refused","message":"egress"}`,
		`{"level":"info","req_id":"a-4","method":"GET","scheme":"http","decision":"error","reason":"upstream_unreachable","status":502,"error":"dial tcp 127.0.0.1:4343: connect: connection refused","message":"egress"}`,
		`{"level":"info","message":"draining"}`,
		`{"level":"warn","error":"boom","message":"drain timed out"}`,
		`not json`,
	}
	var s logSummary
	for _, l := range lines {
		s.add([]byte(l))
	}
	if s.Lines != 9 || s.EgressLines != 5 || s.Allowed200 != 3 || s.Scrubbed != 1 {
		t.Errorf("lines %d, egress %d, allowed %d, scrubbed %d; want 9, 5, 3, 1", s.Lines, s.EgressLines, s.Allowed200, s.Scrubbed)
	}
	want := map[string]int64{
		"GET http: decision=error status=502 reason=upstream_unreachable error=dial tcp 127.x:port: connect: connection refused": 2,
		"warn: drain timed out: boom": 1,
		"unparsed line: not json":     1,
	}
	if len(s.Unexpected) != len(want) {
		t.Errorf("unexpected = %v, want %v", s.Unexpected, want)
	}
	for k, n := range want {
		if s.Unexpected[k] != n {
			t.Errorf("unexpected[%q] = %d, want %d (all: %v)", k, s.Unexpected[k], n, s.Unexpected)
		}
	}
	if len(s.Examples) != 4 {
		t.Errorf("%d examples, want 4", len(s.Examples))
	}
}

func TestListening(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	log := `{"level":"info","listener":"bench","address":"127.0.0.1:40139","message":"listening"}
{"level":"info","listener":"admin","address":"127.0.0.1:45341","message":"listening"}
{"level":"info","message":"egressd started"}
{"level":"info","listener":"adm`
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := listening(p)
	if err != nil {
		t.Fatal(err)
	}
	if got["bench"] != "127.0.0.1:40139" || got["admin"] != "127.0.0.1:45341" || len(got) != 2 {
		t.Errorf("listening = %v", got)
	}
}

func TestConfigNamesOnlyLoopback(t *testing.T) {
	up := &upstream{httpAddr: "127.0.0.1:1080", tlsAddr: "127.0.0.1:1443", caPEM: []byte("pem")}
	dir := t.TempDir()
	path, err := writeConfig(dir, up, "127.0.0.1:5353", "", benchMaxConnections)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ports: [1080, 1443]", "address: 127.0.0.1:0", "unsafe_allow_cidrs: [127.0.0.0/8]", "level: info",
		"resolver: 127.0.0.1:5353", "domain: inject.bench.test", `transform: {"X-Bench-Injected": "bench-transform-value"}`,
		"domain: cred.bench.test", "credential: bench-cred", "intercept: auto",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %q:\n%s", want, b)
		}
	}
	creds, err := os.ReadFile(filepath.Join(dir, "credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed map[string]map[string]string
	if err := json.Unmarshal(creds, &parsed); err != nil || parsed[credentialID]["token"] != credentialToken {
		t.Errorf("credentials.json = %s (%v)", creds, err)
	}
}

// TestVaultConfig: the vault path's egressd has the same config but for its
// credentials section, which names the Vault on 127.0.0.1 and a token file, and
// no credentials.json is written for it.
func TestVaultConfig(t *testing.T) {
	up := &upstream{httpAddr: "127.0.0.1:1080", tlsAddr: "127.0.0.1:1443", caPEM: []byte("pem")}
	dir := t.TempDir()
	path, err := writeConfig(dir, up, "127.0.0.1:5353", vaultCredentials("http://127.0.0.1:8200", "/tmp/x/vault-token"), benchMaxConnections)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"domain: cred.bench.test", "credential: bench-cred", "backend: vault", `address: "http://127.0.0.1:8200"`,
		`auth: {method: token, token_file: "/tmp/x/vault-token"}`, "kv_prefix: egressd/credentials", "refresh: 2s",
		"\nlog:\n",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %q:\n%s", want, b)
		}
	}
	if strings.Contains(string(b), "credentials.json") {
		t.Errorf("the vault config names credentials.json:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "credentials.json")); err == nil {
		t.Error("credentials.json written for the vault egressd")
	}
}

func TestParseLeafCache(t *testing.T) {
	metrics := `# HELP egressd_leaf_cache_total Leaf certificate cache lookups by result (hit, miss).
# TYPE egressd_leaf_cache_total counter
egressd_leaf_cache_total{result="hit"} 12345
egressd_leaf_cache_total{result="miss"} 2
egressd_leaf_cache_totally_other 7
`
	got, err := parseLeafCache([]byte(metrics))
	if err != nil || got != (leafCounts{Hit: 12345, Miss: 2}) {
		t.Errorf("parseLeafCache = %+v, %v", got, err)
	}
	if _, err := parseLeafCache([]byte("egressd_requests_total 3\n")); err == nil {
		t.Error("parseLeafCache without the metric succeeded")
	}
}

func TestLogSummaryMerge(t *testing.T) {
	var a, b logSummary
	a.add([]byte(`{"level":"warn","message":"x"}`))
	b.add([]byte(`{"level":"warn","message":"x"}`))
	b.add([]byte(`{"level":"info","method":"GET","scheme":"https","decision":"allow","status":200,"error":"","message":"egress"}`))
	a.merge(b)
	if a.Lines != 3 || a.EgressLines != 1 || a.Allowed200 != 1 || a.Unexpected["warn: x"] != 2 || len(a.Examples) != 2 {
		t.Errorf("merged = %+v", a)
	}
}
