package node_test

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/netns"
	"github.com/egressd/egressd/internal/node"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// A worker's death frees no sandbox's port and forgets no registration: the
// supervising parent keeps the sockets egressd opened in the sandbox's namespace
// and the spec registered through the API, and the next worker serves them. While
// no worker runs, a process in the sandbox that tries to bind the port its traffic
// is redirected to is refused, and a connection it makes waits in the backlog and
// is answered by the next worker. An upgrade (SIGUSR2) hands them over the same
// way; a DELETE lets the port go.
func TestNodeWorkerRestart(t *testing.T) {
	w := newWorld(t)
	addSandbox(t, "sbx-r")
	if code, body := w.put(t, "sbx-r", spec("sbx-r", "", "a.test+key")); code != http.StatusCreated {
		t.Fatalf("PUT sbx-r: %d %s", code, body)
	}
	if status, reason := w.curl(t, "sbx-r", "a.test"); status != "200" {
		t.Fatalf("before the restart: %s %s", status, reason)
	}
	first := w.e.ServingPid()

	squatted := make(chan string, 1)
	stop := make(chan struct{})
	go squat("sbx-r", "127.0.0.1:"+transparentPort, stop, squatted)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	egressdtest.WaitDead(t, first) // a connection its last moment accepted would die with it
	during := make(chan string, 1)
	go func() { status, _ := w.curl(t, "sbx-r", "a.test"); during <- status }()
	second := w.waitNewWorker(t, first)
	close(stop)
	if s := <-squatted; s != "" {
		t.Errorf("while the worker restarted, a process in the sandbox bound its port: %s", s)
	}
	if status := <-during; status != "200" {
		t.Errorf("a request made while the worker restarted: %s, want 200 from the next worker", status)
	}
	w.servedAgain(t, "after a SIGKILL")

	if err := w.e.SignalNow(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	w.waitNewWorker(t, second)
	w.servedAgain(t, "after an upgrade")

	if code := w.del(t, "sbx-r"); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	// The upgraded-from worker may still be draining: it lets go of its copy then.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := bindIn("sbx-r", "127.0.0.1:"+transparentPort)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2s after DELETE the port is still held: %v", err)
		}
	}
}

// servedAgain checks that sbx-r is registered (from the API) and served, with its
// credential, by the worker now running.
func (w *world) servedAgain(t *testing.T, when string) {
	t.Helper()
	code, info := w.get(t, "sbx-r")
	if code != http.StatusOK || info["source"] != "api" {
		t.Fatalf("%s: GET sbx-r: %d %v, want the API's registration kept", when, code, info)
	}
	if status, reason := w.curl(t, "sbx-r", "a.test"); status != "200" {
		t.Errorf("%s: %s %s, want 200", when, status, reason)
	}
	if auths := w.up.authsFor("a.test"); len(auths) == 0 || auths[len(auths)-1] != "Bearer "+w.secrets["node"] {
		t.Errorf("%s: the upstream saw %q last, want the node's credential", when, auths)
	}
}

// waitNewWorker waits for a worker other than prev to have started, and returns it.
func (w *world) waitNewWorker(t *testing.T, prev int) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pid := w.e.ServingPid(); pid != prev {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("no new worker within 30s")
		}
	}
}

// squat tries to bind addr in sandbox name until stop closes, as a process in the
// sandbox racing egressd's restart would; it reports the first success ("" for
// none). It binds as root: a sandbox's own users can do no more.
func squat(name, addr string, stop <-chan struct{}, got chan<- string) {
	for {
		select {
		case <-stop:
			got <- ""
			return
		default:
		}
		if err := bindIn(name, addr); err == nil {
			got <- "bound " + addr
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// bindIn binds addr inside sandbox name and lets it go at once; EADDRINUSE when
// the port is held.
func bindIn(name, addr string) error {
	return netns.Do("/run/netns/"+name, func() error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		return ln.Close()
	})
}

// A sandbox's port is never free, whatever happens to its spec: renaming a
// listener keeps the very socket (a squatter in the sandbox never binds it); a
// spec file refused since, across a worker's death, keeps the last good spec and
// its sockets; a namespace made anew at the same path is served in the new one.
func TestNodeSocketsNeverFree(t *testing.T) {
	w := newWorld(t)
	addSandbox(t, "sbx-s")
	file := filepath.Join(w.dir, "sandboxes.d", "sbx-s.json")
	good := spec("sbx-s", "", "a.test+key")
	writeSpec(t, file, good)
	w.waitRegistered(t, "sbx-s", 5*time.Second)
	addr := "127.0.0.1:" + transparentPort

	squatted := make(chan string, 1)
	stop := make(chan struct{})
	go squat("sbx-s", addr, stop, squatted)
	first := listenInode(t, "sbx-s", transparentPort)
	renamed := strings.Replace(good, `"name": "transparent"`, `"name": "redirected"`, 1)
	writeSpec(t, file, renamed)
	w.waitListener(t, "sbx-s", "redirected")
	if got := listenInode(t, "sbx-s", transparentPort); got != first {
		t.Errorf("renaming the listener changed its socket (inode %s, then %s)", first, got)
	}
	if status, reason := w.curl(t, "sbx-s", "a.test"); status != "200" {
		t.Errorf("after the rename: %s %s", status, reason)
	}

	writeSpec(t, file, `{"netns": "/run/netns/sbx-s", "listeners": []}`)
	time.Sleep(2 * node.DirPoll) // the refused file is read and logged
	worker := w.e.ServingPid()
	if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.waitNewWorker(t, worker)
	close(stop)
	if s := <-squatted; s != "" {
		t.Errorf("a process in the sandbox bound its port: %s", s)
	}
	w.waitListener(t, "sbx-s", "redirected")
	if status, reason := w.curl(t, "sbx-s", "a.test"); status != "200" {
		t.Errorf("the last good spec after a worker's death: %s %s", status, reason)
	}

	// A spec file the node cannot serve (a port the sandbox's code holds) keeps
	// the last good spec, across a worker's death too.
	held, err := netns.Listen("/run/netns/sbx-s", "tcp", "127.0.0.1:16001")
	if err != nil {
		t.Fatal(err)
	}
	// (the port it cannot have last: the start claims the others first)
	writeSpec(t, file, strings.Replace(renamed, `"mode": "transparent"}]`, `"mode": "transparent"}, {"name": "taken", "address": "127.0.0.1:16001"}]`, 1))
	time.Sleep(2 * node.DirPoll)
	stop, squatted = make(chan struct{}), make(chan string, 1)
	go squat("sbx-s", addr, stop, squatted)
	before := listenInode(t, "sbx-s", transparentPort)
	second := w.e.ServingPid()
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.waitNewWorker(t, second)
	w.waitListener(t, "sbx-s", "redirected")
	close(stop)
	if s := <-squatted; s != "" {
		t.Errorf("with an unservable spec file, a worker's death freed the port: %s", s)
	}
	if status, reason := w.curl(t, "sbx-s", "a.test"); status != "200" {
		t.Errorf("the last good spec after an unservable file and a worker's death: %s %s", status, reason)
	}
	if after := listenInode(t, "sbx-s", transparentPort); after != before {
		t.Errorf("the listening socket changed (inode %s, then %s): the port was free for a moment", before, after)
	}
	held.Close()

	exec.Command("ip", "netns", "del", "sbx-s").Run()
	addSandbox(t, "sbx-s")
	for deadline := time.Now().Add(5 * time.Second); bindIn("sbx-s", addr) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the namespace made anew was not served within 5s")
		}
	}
	if status, reason := w.curl(t, "sbx-s", "a.test"); status != "200" {
		t.Errorf("in the namespace made anew: %s %s", status, reason)
	}
}

// waitListener waits until sandbox id serves a listener called name.
func (w *world) waitListener(t *testing.T, id, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, info := w.get(t, id)
		if l, _ := info["listeners"].(map[string]any); code == http.StatusOK && l[name] != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s serves no listener %q after 10s: %d %v", id, name, code, info)
		}
	}
}

// listenInode is the inode of the socket listening on 127.0.0.1:port in sandbox
// name: the same inode is the very same socket.
func listenInode(t *testing.T, name, port string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", name, "cat", "/proc/net/tcp").Output()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	local := fmt.Sprintf("0100007F:%04X", p)
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == local && f[3] == "0A" {
			return f[9]
		}
	}
	t.Fatalf("nothing listens on 127.0.0.1:%s in %s", port, name)
	return ""
}
