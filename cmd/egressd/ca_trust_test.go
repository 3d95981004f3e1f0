package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// sandboxUID is the user the sandbox runs as in the netns kit's instructions: not
// egressd's, so it reads only what every user may read.
const sandboxUID = "1000"

// TestCATrustEveryUser: `egressd ca env` names files the sandbox's user can read.
// As uid 1000, curl with the printed CURL_CA_BUNDLE, and a Java HttpClient with the
// printed JAVA_TOOL_OPTIONS (the PKCS#12 trust store), both through egressd to an
// intercepted host, trust egressd's leaf and get the upstream's answer.
func TestCATrustEveryUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run clients as uid " + sandboxUID)
	}
	up := startRecordingUpstream(t)
	dns := dnsstub.Start(t)
	dns.Set(vaultHost, "A 127.0.0.1")
	dir := t.TempDir()
	// t.TempDir's directories are 0700: let other users pass through (not list) them,
	// as they can through /var/lib or a checkout; egressd must do the rest itself.
	for d := dir; d != filepath.Dir(os.TempDir()); d = filepath.Dir(d) {
		if d == os.TempDir() {
			break
		}
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(dir, "egressd.yaml")
	cfg := fmt.Sprintf(`version: 1
listeners: [{name: sandbox, address: "127.0.0.1:0"}]
admin: {address: "127.0.0.1:0"}
policy:
  allowlist:
    - {domain: %s, ports: [%d], transform: {X-Demo: injected}}
network: {resolver: %q, unsafe_allow_cidrs: [127.0.0.0/8]}
tls: {upstream_ca_file: %q}
credentials: {file: credentials.json}
state_dir: state
`, vaultHost, up.port, dns.Addr, up.caFile)
	if err := os.WriteFile(filepath.Join(dir, "credentials.json"), []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startRunnerIn(t, dir, cfgPath)
	res := egressd(t, "ca", "env", "--config", cfgPath)
	if res.code != 0 {
		t.Fatalf("ca env: %s", res)
	}
	env := exportedEnv(t, res.stdout)
	target := fmt.Sprintf("https://%s:%d/trust", vaultHost, up.port)
	proxy := "http://" + d.Proxy

	curl := asSandboxUser(t, []string{"CURL_CA_BUNDLE=" + env["CURL_CA_BUNDLE"]},
		"curl", "-sS", "--max-time", "20", "-x", proxy, target)
	if out, err := curl.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("curl as uid %s with CURL_CA_BUNDLE=%s: %v\n%s", sandboxUID, env["CURL_CA_BUNDLE"], err, out)
	}

	src := filepath.Join(dir, "java")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "Main.java"), []byte(javaClient), 0o644); err != nil {
		t.Fatal(err)
	}
	java := asSandboxUser(t, []string{"JAVA_TOOL_OPTIONS=" + env["JAVA_TOOL_OPTIONS"], "HOME=" + src},
		"java", filepath.Join(src, "Main.java"), "127.0.0.1", strings.TrimPrefix(d.Proxy, "127.0.0.1:"), target)
	if out, err := java.CombinedOutput(); err != nil || !strings.Contains(string(out), "200 ok") {
		t.Errorf("java as uid %s with JAVA_TOOL_OPTIONS=%s: %v\n%s", sandboxUID, env["JAVA_TOOL_OPTIONS"], err, out)
	}
	got := 0
	for _, r := range up.Requests() {
		if r.Header.Get("X-Demo") == "injected" {
			got++
		}
	}
	if got != 2 {
		t.Errorf("the upstream saw %d intercepted requests (X-Demo injected), want 2 (curl, java)", got)
	}
}

// javaClient is a single-file Java program: GET args[2] through the proxy
// args[0]:args[1] with java.net.http.HttpClient, trusting what the JVM's trust store
// says (JAVA_TOOL_OPTIONS), and print "<status> <body>".
const javaClient = `import java.net.*;
import java.net.http.*;
import java.time.Duration;

public class Main {
  public static void main(String[] args) throws Exception {
    HttpClient c = HttpClient.newBuilder()
        .proxy(ProxySelector.of(new InetSocketAddress(args[0], Integer.parseInt(args[1]))))
        .connectTimeout(Duration.ofSeconds(20)).build();
    HttpResponse<String> r = c.send(HttpRequest.newBuilder(URI.create(args[2])).build(),
        HttpResponse.BodyHandlers.ofString());
    System.out.println(r.statusCode() + " " + r.body().trim());
  }
}
`

// asSandboxUser is cmd run as uid and gid 1000 with no other groups, with env.
func asSandboxUser(t *testing.T, env []string, cmd ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"--reuid", sandboxUID, "--regid", sandboxUID, "--clear-groups", "--"}, cmd...)
	c := exec.Command("setpriv", args...)
	c.Env = append(cleanProxyEnv(), env...)
	c.WaitDelay = 5 * time.Second
	return c
}

// cleanProxyEnv is this process's environment without proxy or CA settings.
func cleanProxyEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.Contains(strings.ToLower(name), "proxy") && !strings.Contains(name, "CA_") && name != "SSL_CERT_FILE" && name != "JAVA_TOOL_OPTIONS" {
			out = append(out, kv)
		}
	}
	return out
}

// exportedEnv parses `egressd ca env`'s export lines.
func exportedEnv(t *testing.T, out string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if kv, ok := strings.CutPrefix(line, "export "); ok {
			name, value, _ := strings.Cut(kv, "=")
			env[name] = strings.ReplaceAll(strings.Trim(value, "'"), `'\''`, "'")
		}
	}
	for _, name := range []string{"CURL_CA_BUNDLE", "JAVA_TOOL_OPTIONS"} {
		if env[name] == "" {
			t.Fatalf("ca env printed no %s:\n%s", name, out)
		}
	}
	return env
}

// startRunnerIn starts egressd in dir on the config already written at cfgPath.
func startRunnerIn(t *testing.T, dir, cfgPath string) *runner {
	t.Helper()
	return &runner{Egressd: egressdtest.StartT(t, egressdtest.Options{Dir: dir, ConfigPath: cfgPath}), t: t}
}
