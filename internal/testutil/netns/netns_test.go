package netns_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/netns"
)

// TestIsolate shows the namespace: lo is the only interface, it is up, and a
// dial to an address that is not local fails before sending anything.
func TestIsolate(t *testing.T) {
	netns.Isolate(t)
	assertOnlyLoopback(t)
	// 10.255.255.1 is reachable only by a route, and there is none here.
	var d net.Dialer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := d.DialContext(ctx, "tcp", "10.255.255.1:80")
	if !errors.Is(err, syscall.ENETUNREACH) {
		t.Fatalf("dial 10.255.255.1:80 in the namespace: %v, want network unreachable", err)
	}
}

// TestIsolateSubtest shows that Isolate selects one subtest, spaces and
// regexp metacharacters in its name included.
func TestIsolateSubtest(t *testing.T) {
	for _, name := range []string{"plain", "with space (and [meta])"} {
		t.Run(name, func(t *testing.T) {
			netns.Isolate(t)
			assertOnlyLoopback(t)
		})
	}
}

func TestAddLoopbackAddr(t *testing.T) {
	netns.Isolate(t)
	netns.AddLoopbackAddr(t, "10.0.0.5/32")
	netns.AddLoopbackAddr(t, "fd00::5/128")
	for _, addr := range []string{"10.0.0.5:0", "[fd00::5]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen %s: %v", addr, err)
		}
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", ln.Addr(), err)
		}
		c.Close()
		ln.Close()
	}
}

func TestRunPattern(t *testing.T) {
	for name, want := range map[string]string{
		"TestX":                     "^TestX$",
		"TestX/sub":                 "^TestX$/^sub$",
		"TestX/with_space_(a.b)#01": `^TestX$/^with_space_\(a\.b\)#01$`,
	} {
		if got := netns.RunPattern(name); got != want {
			t.Errorf("RunPattern(%q) = %q, want %q", name, got, want)
		}
	}
}

func assertOnlyLoopback(t *testing.T) {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
		t.Fatalf("interfaces in the namespace: %+v, want only lo, up", ifs)
	}
}
