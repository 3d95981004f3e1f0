package netns_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/netns"
)

// TestRun shows the namespace: lo is the only interface, it is up, and a
// dial to an address that is not local fails before sending anything.
func TestRun(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		assertOnlyLoopback(t)
		// 10.255.255.1 is reachable only by a route, and there is none here.
		var d net.Dialer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := d.DialContext(ctx, "tcp", "10.255.255.1:80")
		if !errors.Is(err, syscall.ENETUNREACH) {
			t.Fatalf("dial 10.255.255.1:80 in the namespace: %v, want network unreachable", err)
		}
	})
}

// TestRunSubtest shows that Run selects one subtest, spaces and regexp
// metacharacters in its name included.
func TestRunSubtest(t *testing.T) {
	for _, name := range []string{"plain", "with space (and [meta])"} {
		t.Run(name, func(t *testing.T) {
			netns.Run(t, assertOnlyLoopback)
		})
	}
}

// TestRunBodyOnlyInside shows that the body runs in the namespace and never
// in the test binary that started it.
func TestRunBodyOnlyInside(t *testing.T) {
	calls := 0
	netns.Run(t, func(t *testing.T) {
		calls++
		if !netns.Inside() {
			t.Fatal("body runs outside the namespace")
		}
	})
	if want := map[bool]int{true: 1, false: 0}[netns.Inside()]; calls != want {
		t.Fatalf("body called %d times (Inside=%t), want %d", calls, netns.Inside(), want)
	}
}

func TestAddLoopbackAddr(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
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
	})
}

// envHelper makes the helper tests below do their work; without it they skip.
// TestRunReports sets it when it runs them in a test binary of its own.
const envHelper = "EGRESSD_NETNS_HELPER"

// TestRunReports shows how Run reports the child's result on the calling
// test: a failure in the body fails it with the body's message, a skip skips
// it, a pass passes it with the child's output logged. Each helper runs in a
// test binary of its own, whose output is read.
func TestRunReports(t *testing.T) {
	if netns.Inside() {
		t.Skip("starts test binaries that make namespaces of their own")
	}
	for _, tc := range []struct {
		helper   string
		wantExit bool // the test binary exits non-zero
		want     []string
	}{
		{"TestHelperFail", true, []string{"--- FAIL: TestHelperFail ", "in a loopback-only network namespace", "deliberate failure in the namespace"}},
		{"TestHelperSkip", false, []string{"--- SKIP: TestHelperSkip ", "skipped in a loopback-only network namespace", "deliberate skip in the namespace"}},
		{"TestHelperPass", false, []string{"--- PASS: TestHelperPass ", "passed in a loopback-only network namespace", "deliberate log in the namespace"}},
	} {
		t.Run(tc.helper, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run="+netns.RunPattern(tc.helper), "-test.count=1", "-test.v=true")
			cmd.Env = append(os.Environ(), envHelper+"=1")
			out, err := cmd.CombinedOutput()
			if strings.Contains(string(out), "network namespace unavailable") && os.Getenv("EGRESSD_REQUIRE_NETNS") == "" {
				t.Skipf("no network namespace here:\n%s", out)
			}
			var exit *exec.ExitError
			if gotExit := errors.As(err, &exit); gotExit != tc.wantExit || err != nil && !gotExit {
				t.Fatalf("%s: exit error %v, want one: %t\n%s", tc.helper, err, tc.wantExit, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("%s: output lacks %q:\n%s", tc.helper, w, out)
				}
			}
		})
	}
}

func TestHelperFail(t *testing.T) {
	helperOnly(t)
	netns.Run(t, func(t *testing.T) { t.Error("deliberate failure in the namespace") })
}

func TestHelperSkip(t *testing.T) {
	helperOnly(t)
	netns.Run(t, func(t *testing.T) { t.Skip("deliberate skip in the namespace") })
}

func TestHelperPass(t *testing.T) {
	helperOnly(t)
	netns.Run(t, func(t *testing.T) { t.Log("deliberate log in the namespace") })
}

func helperOnly(t *testing.T) {
	t.Helper()
	if os.Getenv(envHelper) == "" {
		t.Skipf("helper for TestRunReports; runs only with %s set", envHelper)
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
