package netns_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/netns"
	nstest "github.com/egressd/egressd/internal/testutil/netns"
)

// The tests run in a loopback-only namespace of their own, where they make the
// sandboxes' namespaces with `ip netns add`.
func TestMain(m *testing.M) {
	if nstest.Inside() {
		if err := nstest.PrivateNetnsDirs(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(nstest.Main(m))
}

// addNetns makes network namespace name with lo up, removed when t ends.
func addNetns(t *testing.T, name string) string {
	t.Helper()
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// A listener opened in a sandbox's namespace is reached from inside it and from
// nowhere else: not from egressd's own namespace, not from another sandbox's.
func TestListenInsideOnly(t *testing.T) {
	a, b := addNetns(t, "nsa"), addNetns(t, "nsb")
	ln, err := netns.Listen(a, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	if got := dialIn(t, a, addr); got != "hi" {
		t.Errorf("from inside %s: %q, want hi", a, got)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s answered in the process's own namespace", addr)
	}
	if got := dialIn(t, b, addr); got != "" {
		t.Errorf("another namespace reached %s: %q", addr, got)
	}
	pc, err := netns.ListenPacket(a, "udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc.Close()
}

// dialIn reads what addr answers to a connection made inside the namespace at
// path; "" when it refuses.
func dialIn(t *testing.T, path, addr string) string {
	t.Helper()
	var got string
	err := netns.Do(path, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 2)
		n, _ := c.Read(buf)
		got = string(buf[:n])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// No thread of the process is left in a sandbox's namespace: after many entries,
// from many goroutines at once, every thread the runtime runs on is back home.
func TestThreadsReturn(t *testing.T) {
	a := addNetns(t, "nsc")
	home := threadNetns(t)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ln, err := netns.Listen(a, "tcp", "127.0.0.1:0")
			if err != nil {
				t.Error(err)
				return
			}
			ln.Close()
		}()
	}
	wg.Wait()
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := threadNetns(t); got != home {
				t.Errorf("a thread is in %s, not the process's own %s", got, home)
			}
		}()
	}
	wg.Wait()
	if err := netns.Do("/run/netns/absent", func() error { return nil }); err == nil {
		t.Error("entering a namespace that does not exist succeeded")
	}
}

// threadNetns names the network namespace of the calling goroutine's thread.
func threadNetns(t *testing.T) string {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Error(err)
	}
	return s
}
