package readme

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
	"golang.org/x/sys/unix"
)

// TestNodeDoc runs docs/node.md's walk-through and its netns kit section as
// written, block by block with bash from the repository root, as root in this
// package's own network and mount namespaces: /etc/egressd, /var/lib/egressd,
// /run/egressd, /run/netns and /etc/netns are empty tmpfs mounts here, so the
// doc's absolute paths are its own. `make build`'s binary is the one TestMain
// built. api.github.com, pypi.org and files.pythonhosted.org are a local
// stand-in (a stub DNS name, named in the node config as network.resolver, on an
// address that exists only here, with a test-CA certificate egressd and the
// spliced clients trust through SSL_CERT_FILE and CURL_CA_BUNDLE) that answers 200 to the token the
// doc writes and 401 to any other. A comment starting with a status (`# 403
// not_allowlisted`, `# 200`, `# 204`) must match a line of its block's output.
func TestNodeDoc(t *testing.T) {
	caFile := nodeDocWorld(t)
	doc := string(read(t, filepath.Join(repoRoot, "docs/node.md")))
	_, walk, _ := strings.Cut(doc, "## Walk-through")
	walk, _, _ = strings.Cut(walk, "## A plain Linux host")
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(walk, -1)
	if len(blocks) < 8 {
		t.Fatalf("docs/node.md's walk-through has %d sh blocks; the doc has more", len(blocks))
	}
	env := []string{"SSL_CERT_FILE=" + caFile, "CURL_CA_BUNDLE=" + caFile}
	for i, m := range blocks {
		block := strings.ReplaceAll(m[1], "bin/egressd", binary)
		block = strings.Replace(block, "make build\n", "", 1) // TestMain built it
		block = strings.Replace(block, "environment: env_node\n", "environment: env_node\nnetwork: {resolver: \""+nodeDocDNS+"\"}\n", 1)
		out := runWhole(t, block, env)
		for _, want := range expectedLines(m[1]) {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `\s*$`).MatchString(out) {
				t.Errorf("docs/node.md block %d: no output line %q\n%s\noutput:\n%s", i+1, want, m[1], out)
			}
		}
		if i == 0 {
			waitFor(t, "the node's API socket", func() bool { _, err := os.Stat("/run/egressd/node.sock"); return err == nil })
		}
		if strings.Contains(m[1], "mv /etc/egressd/staging/sbx-1.json") {
			waitFor(t, "sbx-1 from the sandboxes directory", func() bool {
				out, _ := exec.Command("curl", "-s", "--unix-socket", "/run/egressd/node.sock", "http://node/v1/sandboxes/sbx-1").Output()
				return bytes.Contains(out, []byte(`"listeners"`))
			})
		}
	}
}

var nodeDocDNS string

// expectedLines are the outputs a block's comments promise: a status code, and
// the reason after it when the comment names one.
func expectedLines(block string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)#\s+(\d{3})\b(.*)$`).FindAllStringSubmatch(block, -1) {
		want := m[1]
		if r := reasonWord.FindString(m[2]); r != "" && strings.HasPrefix(strings.TrimSpace(m[2]), r) {
			want += " " + r
		}
		out = append(out, want)
	}
	return out
}

// nodeDocWorld mounts the doc's directories, starts the stand-in and the stub DNS,
// and returns the stand-in's CA file.
func nodeDocWorld(t *testing.T) string {
	t.Helper()
	if os.Getenv("EGRESSD_REQUIRE_NETNS") == "" && !netns.Inside() {
		t.Skip("outside the namespace")
	}
	for _, tool := range []string{"ip", "iptables", "jq", "ss", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("docs/node.md needs %s (scripts/install-netns-deps.sh)", tool)
		}
	}
	for dir, mode := range map[string]string{"/etc/egressd": "0755", "/var/lib/egressd": "0700", "/run/egressd": "0700",
		"/run/netns": "0755", "/etc/netns": "0755"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+mode); err != nil {
			t.Fatalf("mounting a tmpfs on %s: %v", dir, err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	}
	ca := testpki.New(t)
	const ip = "93.184.216.34"
	netns.AddLoopbackAddr(t, ip+"/32")
	ln, err := net.Listen("tcp", ip+":443")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host == "api.github.com" && r.Header.Get("Authorization") != "Bearer ghp_..." {
				http.Error(w, "bad credentials", http.StatusUnauthorized)
				return
			}
			fmt.Fprintln(w, "ok")
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "api.github.com", "pypi.org", "files.pythonhosted.org")}},
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	dns := dnsstub.Start(t)
	for _, h := range []string{"api.github.com", "pypi.org", "files.pythonhosted.org"} {
		dns.Set(h, "A "+ip)
	}
	nodeDocDNS = dns.Addr
	caFile := filepath.Join(t.TempDir(), "standin-ca.pem")
	write(t, caFile, ca.PEM())
	t.Cleanup(func() {
		for _, n := range []string{"sbx-1", "sbx-2", "sbx-3", "sbx4"} {
			exec.Command("ip", "netns", "del", n).Run()
		}
	})
	return caFile
}

// runWhole runs a block with bash in its own process group, which the test's end
// kills (with what the block left running, `bin/egressd run &`).
func runWhole(t *testing.T, block string, env []string) string {
	t.Helper()
	c := exec.Command("bash", "-c", block)
	c.Dir, c.Env = repoRoot, cleanEnv(env)
	// A file, not a pipe: what the block leaves running keeps its output open.
	f, err := os.CreateTemp(t.TempDir(), "block-*.out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c.Stdout, c.Stderr = f, f
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		time.Sleep(100 * time.Millisecond)
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	})
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		err = fmt.Errorf("still running after 60s")
	}
	out, _ := os.ReadFile(f.Name())
	if err != nil {
		t.Fatalf("docs/node.md block: %v\n%s\noutput:\n%s", err, block, out)
	}
	return string(out)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 15s", what)
		}
	}
}
