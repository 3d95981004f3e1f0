package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// These tests cover the process model (docs/configuration.md, "Process model"):
// `egressd run` is a parent that holds the sockets and a worker that serves them.
// test/conformance kills the worker under hook load and upgrades it.

// TestRunWorkerRestarted: the worker killed with SIGKILL is restarted by the
// parent, which logs one line with its status; a connection made while no worker
// runs waits in the backlog and is served by the next worker; SIGHUP still
// reloads and SIGTERM still drains and exits 0, through the parent.
func TestRunWorkerRestarted(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))
	worker := d.ServingPid()
	if worker == d.Pid() {
		t.Fatalf("the serving process is the one started (%d): no supervisor", worker)
	}
	if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Once the worker is dead (a connection its last moment accepted would die
	// with it, as docs/configuration.md says), while the next one may still be
	// starting: the parent's socket takes it.
	egressdtest.WaitDead(t, worker)
	nc, err := net.DialTimeout("tcp", d.Proxy, time.Second)
	if err != nil {
		t.Fatalf("a connection right after the worker was killed: %v, want it to wait in the backlog", err)
	}
	defer nc.Close()
	if code, err := getOn(nc, up.port, "/after-kill"); code != http.StatusOK {
		t.Fatalf("the request made while the worker was down: %d %v, want the next worker's 200", code, err)
	}

	exited := d.waitLog("the worker's exit", func(l logLine) bool { return strings.HasPrefix(l.Str("message"), "worker exited") })
	if exited.Num("pid") != float64(worker) || exited.Str("status") != "signal: killed" || exited.Str("level") != "warn" {
		t.Errorf("restart line %v: want pid %d, status \"signal: killed\", level warn", exited, worker)
	}
	d.waitNth("the second worker's start", 2, func(l logLine) bool { return l.Str("message") == "egressd started" })
	if now := d.ServingPid(); now == worker || now == d.Pid() {
		t.Errorf("serving pid after the restart %d (killed %d, parent %d)", now, worker, d.Pid())
	}

	d.signal(syscall.SIGHUP)
	d.waitLog("config reloaded", func(l logLine) bool { return l.Str("message") == "config reloaded" })
	d.signal(syscall.SIGTERM)
	if code := d.waitExit(waitTimeout); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
}

// TestRunWorkerCrashLoop: workers that die young are restarted after a back-off
// that doubles (0 for the first, whose predecessor had served a while, then 100
// ms, 200 ms, ...), the parent and its sockets staying up; once they can start
// again one serves. Here they die because the config on disk became invalid
// after start (the running worker kept its last good one).
func TestRunWorkerCrashLoop(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	good := runConfig(runOpts{ports: []int{up.port}})
	d := startRunner(t, good)
	time.Sleep(1100 * time.Millisecond) // past the supervisor's 1 s: this one is no young death
	d.rewriteConfig("version: 1\nlisteners: nonsense\n")
	if err := syscall.Kill(d.ServingPid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	isRestart := func(l logLine) bool { return strings.HasPrefix(l.Str("message"), "worker exited") }
	for i, want := range []float64{0, 100, 200} {
		l := d.waitNth(fmt.Sprintf("restart %d", i+1), i+1, isRestart)
		if l.Num("restart_in") != want {
			t.Errorf("restart %d: restart_in %v ms, want %v (status %s)", i+1, l.Num("restart_in"), want, l.Str("status"))
		}
	}
	d.rewriteConfig(good)
	d.waitNth("a worker serving again", 2, func(l logLine) bool { return l.Str("message") == "egressd started" })
	if res, body := get(t, d.proxyClient(), fmt.Sprintf("http://localhost:%d/again", up.port)); res.StatusCode != http.StatusOK {
		t.Errorf("after the crash loop: %d %s, want 200", res.StatusCode, body)
	}
}

// TestRunDrainAnswersAcceptedConnection: a connection accepted before SIGTERM
// whose request comes just after it (the drain has begun) is answered, not
// closed: the drain lets such connections become requests before it waits for
// the requests in flight. New connections are refused meanwhile.
func TestRunDrainAnswersAcceptedConnection(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, nil)
	d := startRunner(t, runConfig(runOpts{ports: []int{up.port}}))
	nc, err := net.DialTimeout("tcp", d.Proxy, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	time.Sleep(100 * time.Millisecond) // accepted by the worker, nothing sent
	d.signal(syscall.SIGTERM)
	d.waitLog("draining", func(l logLine) bool { return l.Str("message") == "draining" })
	waitRefused(t, d.Proxy)
	if code, err := getOn(nc, up.port, "/late"); code != http.StatusOK {
		t.Fatalf("a request on a connection accepted before SIGTERM: %d %v, want the upstream's 200", code, err)
	}
	if code := d.waitExit(waitTimeout); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
}

// TestRunNoSupervise: with --no-supervise one process serves, and killing it
// closes its ports: what the supervisor is for.
func TestRunNoSupervise(t *testing.T) {
	t.Parallel()
	e := egressdtest.StartT(t, egressdtest.Options{RawConfig: runConfig(runOpts{ports: []int{80}}),
		Files: map[string]string{"credentials.json": "{}"}, Args: []string{"--no-supervise"}})
	if e.ServingPid() != e.Pid() {
		t.Fatalf("--no-supervise: serving pid %d, started pid %d", e.ServingPid(), e.Pid())
	}
	e.Kill()
	if _, err := net.DialTimeout("tcp", e.Proxy, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after killing the one process: %v, want connection refused", err)
	}
}

// TestRunSocketActivation: under systemd's socket activation (played by
// systemd-socket-activate, which starts egressd at the first connection), egressd
// serves the socket it is handed rather than binding its own (it could not: the
// address is taken), opens the others itself, and answers that first connection.
func TestRunSocketActivation(t *testing.T) {
	t.Parallel()
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("no systemd-socket-activate")
	}
	up := startUpstream(t, nil)
	addr := freeAddr(t)
	first := make(chan string, 1)
	go func() { first <- firstRequest(addr, up.port) }()
	e := egressdtest.StartT(t, egressdtest.Options{
		RawConfig: runConfig(runOpts{listener: addr, ports: []int{up.port}}),
		Files:     map[string]string{"credentials.json": "{}"},
		Wrap:      []string{activate, "--listen=" + addr},
	})
	if got := <-first; got != "200" {
		t.Errorf("the connection that activated egressd: %s, want 200", got)
	}
	if e.Proxy != addr || e.Admin == "" {
		t.Errorf("listening on %s (admin %s), want %s and an admin address", e.Proxy, e.Admin, addr)
	}
	if _, err := e.Stop(); err != nil {
		t.Error(err)
	}
}

// freeAddr is a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// firstRequest sends a GET for the upstream on port through the proxy at addr,
// dialling until the address accepts, and returns the status or what failed.
func firstRequest(addr string, port int) string {
	deadline := time.Now().Add(waitTimeout)
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			if time.Now().After(deadline) {
				return err.Error()
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		defer nc.Close()
		code, err := getOn(nc, port, "/first")
		if err != nil {
			return err.Error()
		}
		return fmt.Sprint(code)
	}
}

// getOn sends a GET for path of the upstream on port through the proxy
// connection nc and returns the status, waiting up to twice waitTimeout.
func getOn(nc net.Conn, port int, path string) (int, error) {
	nc.SetDeadline(time.Now().Add(2 * waitTimeout))
	fmt.Fprintf(nc, "GET http://localhost:%d%s HTTP/1.1\r\nHost: localhost:%d\r\n\r\n", port, path, port)
	res, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// TestRunPortInUseNamesHolder: egressd that finds its port taken says so in one
// line naming the process that holds it.
func TestRunPortInUseNamesHolder(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	comm, _ := os.ReadFile("/proc/self/comm")
	dir := writeFiles(t, map[string]string{"credentials.json": "{}",
		"egressd.yaml": runConfig(runOpts{listener: held.Addr().String(), ports: []int{80}})})
	res := egressd(t, "run", "--config", dir+"/egressd.yaml")
	want := fmt.Sprintf("%s is in use by pid %d (%s)", held.Addr(), os.Getpid(), strings.TrimSpace(string(comm)))
	var lines []string
	for _, l := range parseLines(strings.Split(res.stdout, "\n")) {
		if strings.Contains(l.Str("error"), want) {
			lines = append(lines, l.Str("error"))
		}
	}
	if len(lines) != 1 || res.code != exitRuntime {
		t.Errorf("run with its port held by this test: %s\nwant exit %d and one line with %q", res, exitRuntime, want)
	}
}
