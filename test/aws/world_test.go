package aws_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// The S3 stand-in answers for AWS's own name, at an address that exists only on lo
// inside the test's namespace.
const (
	s3Host   = "s3.us-east-1.amazonaws.com"
	s3IP     = "93.184.216.34"
	python   = "/usr/bin/python3" // Debian's, which sees python3-boto3
	awsCLI   = "/usr/bin/aws"     // Debian's awscli
	minioEnv = "EGRESSD_MINIO_BIN"
)

// The sandbox's addresses in transparent mode: 10.200.sandboxIndex.0/30.
const (
	sandboxName     = "aws"
	sandboxIndex    = 3
	transparentPort = 15102
	dnsGuardPort    = 15153
)

// s3 is one MinIO server with its root keys, which stand for an AWS account's.
type s3 struct {
	accessKey, secretKey string
	caPEM                string
	cmd                  *exec.Cmd
}

// requireClients fails (EGRESSD_REQUIRE_CLIENTS, as make test sets it) or skips.
func requireClients(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("EGRESSD_REQUIRE_CLIENTS") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// minioBin is the cached MinIO binary (scripts/minio.sh build, run by make deps).
func minioBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(minioEnv); p != "" {
		return p
	}
	out, err := exec.Command("../../scripts/minio.sh", "path").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || p == "" {
		requireClients(t, "MinIO is not built (make deps runs scripts/minio.sh build): %v", err)
	}
	return p
}

// startS3 starts MinIO on s3IP:443 with TLS from ca, for s3Host and s3IP.
func startS3(t *testing.T, ca *testpki.CA) *s3 {
	t.Helper()
	bin := minioBin(t)
	netns.AddLoopbackAddr(t, s3IP+"/32")
	dir := t.TempDir()
	leaf := ca.Leaf(t, s3Host, s3IP)
	key, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(dir, "certs")
	writeFile(t, filepath.Join(certs, "public.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}))
	writeFile(t, filepath.Join(certs, "private.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}))
	s := &s3{accessKey: "AKIAREAL" + strings.ToUpper(randHex(6)), secretKey: randHex(20), caPEM: string(ca.PEM())}
	s.cmd = exec.Command(bin, "server", "--quiet", "--address", s3IP+":443", "--console-address", "127.0.0.1:0",
		"--certs-dir", certs, filepath.Join(dir, "data"))
	s.cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.accessKey, "MINIO_ROOT_PASSWORD="+s.secretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	logf, _ := os.Create(filepath.Join(dir, "minio.log"))
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cmd.Process.Kill(); s.cmd.Wait(); logf.Close() })
	waitS3(t, ca, filepath.Join(dir, "minio.log"))
	return s
}

// waitS3 waits until MinIO answers its health check.
func waitS3(t *testing.T, ca *testpki.CA, logPath string) {
	t.Helper()
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig(ca)}}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := c.Get("https://" + s3IP + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
	}
	log, _ := os.ReadFile(logPath)
	t.Fatalf("MinIO not ready within 60 s:\n%s", log)
}

// world is one egressd (explicit or transparent) in front of the S3 stand-in.
type world struct {
	mode string
	e    *egressdtest.Egressd
	sb   *netns.Sandbox
	env  []string // the clients' environment: CA trust, proxy, placeholders
	dir  string
}

// setup is the egressd config, its files, and the credentials section.
type setup struct {
	creds   *egressdtest.Credentials
	files   map[string]string
	credID  string
	regions []string
}

func newWorld(t *testing.T, mode string, up *s3, su setup) *world {
	t.Helper()
	w := &world{mode: mode, dir: t.TempDir()}
	dns := dnsstub.Start(t)
	dns.Set(s3Host, "A "+s3IP)
	cfg := &egressdtest.Config{
		Version: 1, Environment: "env_aws",
		Listeners:   []egressdtest.Listener{{Name: "sandbox", Address: "127.0.0.1:0", Mode: "proxy"}},
		Admin:       &egressdtest.Admin{Address: "127.0.0.1:0"},
		Policy:      egressdtest.Policy{File: "environment.json"},
		Network:     egressdtest.Network{Resolver: dns.Addr},
		TLS:         &egressdtest.TLS{UpstreamCAFile: "upstream-ca.pem"},
		Credentials: su.creds,
		Log:         &egressdtest.Log{Level: "debug", Format: "json"},
		StateDir:    "state",
	}
	if mode == "transparent" {
		w.sb = netns.NewSandbox(t, "../../deploy/netns/egressd-netns", sandboxName, sandboxIndex,
			netns.SandboxPorts{Transparent: transparentPort, DNS: dnsGuardPort})
		cfg.Listeners = []egressdtest.Listener{{Name: "sandbox", Mode: "transparent", Redirect: "gateway",
			Address: w.sb.HostIP + ":" + strconv.Itoa(transparentPort)}}
		cfg.DNS = &egressdtest.DNS{Listen: w.sb.HostIP + ":" + strconv.Itoa(dnsGuardPort)}
	}
	policy, _ := json.Marshal(map[string]any{
		"network": map[string]any{"allowlist": []map[string]any{{"domain": s3Host, "credential": su.credID,
			"aws": map[string]any{"regions": su.regions, "services": []string{"s3"}}}}},
		"env": map[string]any{"AWS_ACCESS_KEY_ID": map[string]string{"credential": su.credID},
			"AWS_SECRET_ACCESS_KEY": map[string]string{"credential": su.credID}},
	})
	files := map[string]string{"environment.json": string(policy), "upstream-ca.pem": up.caPEM}
	for k, v := range su.files {
		files[k] = v
	}
	w.e = egressdtest.StartT(t, egressdtest.Options{Config: cfg, Files: files, LoopbackOnly: true, Wait: egressdtest.WaitReady})
	w.env = w.clientEnv(t)
	return w
}

// clientEnv: what `egressd sandbox env` and `egressd ca env` give a sandbox, the proxy
// in explicit mode, and nothing else (no AWS profile, no session token).
func (w *world) clientEnv(t *testing.T) []string {
	t.Helper()
	home := filepath.Join(w.dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true",
		"AWS_PAGER="}
	var ph map[string]string
	if err := w.e.AdminJSON("/v1/sandbox/env", 200, &ph); err != nil {
		t.Fatal(err)
	}
	if len(ph) != 2 || !strings.HasPrefix(ph["AWS_ACCESS_KEY_ID"], "AKIA") || len(ph["AWS_SECRET_ACCESS_KEY"]) != 40 {
		t.Fatalf("sandbox env %v: want the placeholder pair", ph)
	}
	for k, v := range ph {
		env = append(env, k+"="+v)
	}
	ca := filepath.Join(w.dir, "egressd-ca.pem")
	pemCA, err := w.e.CAPEM()
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, ca, pemCA)
	env = append(env, "AWS_CA_BUNDLE="+ca)
	if w.mode == "explicit" {
		env = append(env, "HTTPS_PROXY=http://"+w.e.Proxy, "https_proxy=http://"+w.e.Proxy)
	}
	return env
}

// run runs a client program as the sandbox does: in transparent mode inside the
// sandbox's namespace.
func (w *world) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	if w.sb != nil {
		cmd = w.sb.Command(ctx, name, args...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
	}
	cmd.Env = w.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func tlsConfig(ca *testpki.CA) *tls.Config { return &tls.Config{RootCAs: ca.Pool} }

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
