// Package readme runs the README's examples as written, so a broken example fails
// `make test`. Each example block is read from README.md, and its commands run in
// order with bash from the repository root, inside a loopback-only network
// namespace (so the fixed ports the README names are free, and nothing leaves the
// machine): `bin/egressd` is the binary built here, a trailing `&` starts a
// background process that lives until the test ends, and the comments around a
// command say what it must print (a reason code, a detail, "allowed" or "passes
// through", the status line and headers shown as output).
package readme

import (
	"bytes"
	"context"
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
)

const repoRoot = "../.."

var binary string

func TestMain(m *testing.M) {
	if netns.Inside() {
		dir, err := os.MkdirTemp("", "egressd-readme-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		binary = filepath.Join(dir, "egressd")
		build := exec.Command("go", "build", "-o", binary, "../../cmd/egressd")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			os.Exit(1)
		}
		code := netns.Main(m)
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(netns.Main(m))
}

// TestReadmeDevLocal runs the offline example (configs/dev-local.yaml) exactly as
// the README writes it.
func TestReadmeDevLocal(t *testing.T) {
	runBlock(t, readmeBlock(t, "python3 -m http.server"), nil)
}

// TestReadmeTryIt runs the "Try it" block against `make run`'s quick-start config,
// with api.github.com served by a local stand-in (a stub DNS name on an address that
// exists only in this namespace, a test-CA certificate the curl trusts).
func TestReadmeTryIt(t *testing.T) {
	ca := testpki.New(t)
	const ip = "93.184.216.34" // a stand-in public address, on lo in this namespace only
	netns.AddLoopbackAddr(t, ip+"/32")
	ln, err := net.Listen("tcp", ip+":443")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "Practicality beats purity.")
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "api.github.com")}},
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	dns := dnsstub.Start(t)
	dns.Set("api.github.com", "A "+ip)

	dir := t.TempDir()
	caFile := filepath.Join(dir, "upstream-ca.pem")
	write(t, caFile, ca.PEM())
	quick := string(read(t, filepath.Join(repoRoot, "configs/quickstart.yaml")))
	quick = strings.Replace(quick, `resolver: ""`, fmt.Sprintf("resolver: %q", dns.Addr), 1)
	quick = regexp.MustCompile(`(?m)^state_dir: .*$`).ReplaceAllString(quick, "state_dir: "+filepath.Join(dir, "state"))
	cfg := filepath.Join(dir, "quickstart.yaml")
	write(t, cfg, []byte(quick))
	for _, f := range []string{"environment.json", "credentials.json"} {
		write(t, filepath.Join(dir, f), read(t, filepath.Join(repoRoot, "configs", f)))
	}
	// make run, in its own terminal: the quick start, resolving through the stub.
	startBackground(t, binary+" run --config "+cfg, nil)
	// The block's `ca env` merges "the system roots" (SSL_CERT_FILE: the stand-in's
	// CA here) with the CA of the egressd it names, the one running on cfg.
	block := readmeBlock(t, "curl -x http://127.0.0.1:15001 https://api.github.com/zen")
	if !strings.Contains(block, `eval "$(bin/egressd ca env --config configs/quickstart.yaml)"`) {
		t.Error("README: the Try it block does not trust egressd's CA (egressd ca env) before its HTTPS examples")
	}
	runBlock(t, strings.ReplaceAll(block, "configs/quickstart.yaml", cfg), []string{"SSL_CERT_FILE=" + caFile})
}

// readmeBlock returns the ```sh block of README.md that contains marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(read(t, filepath.Join(repoRoot, "README.md"))), -1) {
		if strings.Contains(m[1], marker) {
			return m[1]
		}
	}
	t.Fatalf("README.md has no sh block containing %q", marker)
	return ""
}

// step is one command of a block with what the comments around it expect.
type step struct {
	cmd, notes string
	background bool
}

// steps splits a block into commands; the comment lines just above a command
// (since the last blank line), on its line and just below it are its notes.
func steps(block string) []step {
	var out []step
	var pending []string
	afterCmd := false // the comment lines right below a command are its own
	for _, line := range strings.Split(block, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case trim == "":
			pending, afterCmd = nil, false
		case strings.HasPrefix(trim, "#") && afterCmd:
			out[len(out)-1].notes += "\n" + trim
		case strings.HasPrefix(trim, "#"):
			pending = append(pending, trim)
		default:
			cmd, comment, _ := strings.Cut(line, " #")
			cmd = strings.TrimSpace(cmd)
			s := step{cmd: cmd, notes: strings.Join(pending, "\n") + "\n#" + comment}
			if strings.HasSuffix(cmd, "&") {
				s.cmd, s.background = strings.TrimSpace(strings.TrimSuffix(cmd, "&")), true
			}
			out = append(out, s)
			pending, afterCmd = nil, true
		}
	}
	return out
}

var (
	reasonWord = regexp.MustCompile(`\b(bad_request|not_allowlisted|port_not_allowed|internal_address|host_mismatch|plaintext_credential|method_not_allowed|credential_scope|credential_unavailable|dns_failure|upstream_unreachable|upstream_tls|upstream_timeout|overloaded)\b`)
	detailWord = regexp.MustCompile(`\bdetail (\w+)`)
	outputLine = regexp.MustCompile(`(?m)^# ((?:HTTP/1\.1 \d{3}|Egressd-Reason:).*)$`)
)

// runBlock runs the block's commands in order and checks each against its notes.
// A foreground command is retried for a few seconds while the background ones start.
// An `eval` line runs again before every later foreground command, as one shell would
// have kept what it set.
func runBlock(t *testing.T, block string, env []string) {
	t.Helper()
	var shell string // the `eval` lines so far: they set what the commands after them see
	for _, s := range steps(block) {
		cmd := strings.ReplaceAll(s.cmd, "bin/egressd", binary)
		if s.background {
			startBackground(t, cmd, env)
			continue
		}
		if strings.HasPrefix(cmd, "eval ") {
			shell += cmd + " || exit 1\n"
		}
		cmd = shell + cmd
		var out string
		var problems []string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			var code int
			out, code = run(t, cmd, env)
			if problems = check(s.notes, out, code); len(problems) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, p := range problems {
			t.Errorf("README: %s\n  %s\noutput:\n%s", s.cmd, p, out)
		}
	}
}

// check returns what the output of a command misses of its notes.
func check(notes, out string, code int) []string {
	var problems []string
	if code != 0 {
		problems = append(problems, fmt.Sprintf("exit %d, want 0", code))
	}
	if strings.Contains(notes, "allowed") && !strings.Contains(notes, "not ") || strings.Contains(notes, "passes through") {
		if strings.Contains(out, "Egressd-Reason") || strings.Contains(out, `"reason"`) {
			problems = append(problems, "refused, but the README says it passes")
		}
	}
	for _, w := range reasonWord.FindAllString(notes, -1) {
		if !strings.Contains(out, w) {
			problems = append(problems, "no "+w)
		}
	}
	for _, m := range detailWord.FindAllStringSubmatch(notes, -1) {
		if !strings.Contains(out, `"detail":"`+m[1]+`"`) {
			problems = append(problems, "no detail "+m[1])
		}
	}
	for _, m := range outputLine.FindAllStringSubmatch(notes, -1) {
		if !strings.Contains(out, strings.TrimSpace(m[1])) {
			problems = append(problems, "no line "+m[1])
		}
	}
	return problems
}

func run(t *testing.T, cmd string, env []string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir, c.Env = repoRoot, cleanEnv(env)
	var b bytes.Buffer
	c.Stdout, c.Stderr = &b, &b
	err := c.Run()
	if c.ProcessState == nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return b.String(), c.ProcessState.ExitCode()
}

// startBackground starts cmd in its own process group, ended with the test.
func startBackground(t *testing.T, cmd string, env []string) {
	t.Helper()
	c := exec.Command("bash", "-c", "exec "+cmd)
	c.Dir, c.Env = repoRoot, cleanEnv(env)
	var b bytes.Buffer
	c.Stdout, c.Stderr = &b, &b
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s:\n%s", cmd, b.String())
		}
	})
}

// cleanEnv is this environment without proxy settings, plus extra.
func cleanEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.Contains(strings.ToLower(name), "proxy") && !strings.Contains(name, "CA_BUNDLE") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
