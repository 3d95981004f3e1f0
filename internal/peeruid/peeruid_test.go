package peeruid

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

const nobody = 65534

// TestMain skips the package where a process of another user cannot be started
// (not root), unless make test asks for every namespace test to run.
func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv("EGRESSD_REQUIRE_NETNS") != "" {
			fmt.Fprintln(os.Stderr, "peeruid: these tests run processes as another user: run them as root")
			os.Exit(1)
		}
		fmt.Println("SKIP: peeruid's tests run processes as another user, which needs root")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Only peers running as one of the UIDs are accepted; a connection whose
// process closed it before egressd looked (its socket then kept by the kernel
// alone, and once in TIME_WAIT its UID reads 0) is refused, whoever made it.
func TestAcceptsByUID(t *testing.T) {
	for _, c := range []struct {
		name   string
		uids   []uint32
		as     int    // the connecting process's UID; -1: this process
		script string // after connecting on fd 3
		admit  bool
	}{
		{"this process, admitted", []uint32{0}, -1, "", true},
		{"this process, not among them", []uint32{nobody}, -1, "", false},
		{"nobody, admitted", []uint32{nobody}, nobody, "sleep 3", true},
		{"nobody, not among them", []uint32{0}, nobody, "sleep 3", false},
		{"nobody, closed before the look", []uint32{nobody}, nobody, "echo forged >&3; exec 3>&-", false},
		{"nobody, closed, as uid 0", []uint32{0}, nobody, "echo forged >&3; exec 3>&-", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln, err := Wrap(inner, "", c.uids, "hooks", zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			port := strconv.Itoa(inner.Addr().(*net.TCPAddr).Port)
			if c.as < 0 {
				conn, err := net.Dial("tcp", inner.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
			} else {
				cmd := exec.Command("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port+"; "+c.script)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.as), Gid: uint32(c.as)}}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer func() { cmd.Process.Kill(); cmd.Wait() }()
				if c.script != "sleep 3" {
					cmd.Wait() // the process has closed its end
				}
			}
			if got := admits(t, ln); got != c.admit {
				t.Errorf("admitted %v, want %v", got, c.admit)
			}
		})
	}
}

// admits reports whether ln's Accept returns a connection within a second.
func admits(t *testing.T, ln *Listener) bool {
	t.Helper()
	ln.Listener.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	c, err := ln.Accept()
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// A flood from another user (connections held open, thousands of them, as fast
// as a sandbox's code can make them) delays an admitted peer's connection by no
// more than it takes to turn the flood away: each lookup is one socket's, not a
// walk of every socket the flood holds.
func TestFloodTurnedAwayQuickly(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Wrap(inner, "", []uint32{0}, "hooks", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const flood = 4000
	script := fmt.Sprintf(`import socket, sys, time
held = []
for _ in range(%d):
    s = socket.socket()
    s.connect(("127.0.0.1", %d))
    held.append(s)
print("ready", flush=True)
time.sleep(30)`, flood, inner.Addr().(*net.TCPAddr).Port)
	cmd := exec.Command("/usr/bin/python3", "-c", script) // the system one: another user may run it
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("the flood: %v", err)
	}
	// The flood waits in the backlog, the runtime's connection behind it.
	start := time.Now()
	runtime, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close()
	accepted := make(chan time.Time, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- time.Now()
			c.Close()
		}
	}()
	select {
	case at := <-accepted:
		t.Logf("the admitted peer's connection accepted %v after it connected, behind %d refused", at.Sub(start), flood)
	case <-time.After(3 * time.Second):
		t.Fatalf("the admitted peer's connection still waits 3s behind %d refused", flood)
	}
}
