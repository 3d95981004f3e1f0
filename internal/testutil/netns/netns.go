// Package netns runs a test inside a fresh loopback-only network namespace.
//
// A test that dials addresses which are not on this machine (10.x,
// 169.254.169.254, fd00:ec2::254, public IPs) puts that part in netns.Run.
// Run re-executes the test binary under `unshare -rn`, where the only
// interface is lo, so such a dial fails with "network is unreachable" even
// when the code under test is wrong. The test must still assert its own
// error, not the dial error.
//
//	func TestGuardBlocksMetadata(t *testing.T) {
//		netns.Run(t, func(t *testing.T) {
//			// runs only inside the namespace
//		})
//	}
//
// Code before and after the Run call runs in both processes, the test binary
// and its re-executed copy in the namespace; keep it to setup that is safe in
// either. A package whose every test needs the namespace uses Main instead.
package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// envInside marks the re-executed test binary running in the namespace.
	envInside = "EGRESSD_IN_NETNS"
	// envRequire turns "unshare unavailable" from a skip into a failure;
	// make test sets it.
	envRequire = "EGRESSD_REQUIRE_NETNS"
)

var (
	probeOnce sync.Once
	probeErr  error
	loOnce    sync.Once
	loErr     error
)

// Inside reports whether this process runs in the namespace: the child's
// environment variable is set and lo is the only interface. The second test
// means a stray EGRESSD_IN_NETNS in a developer's shell cannot make a test
// dial out; Run then re-executes the test in a namespace as usual.
func Inside() bool { return inside() }

var inside = sync.OnceValue(func() bool {
	if os.Getenv(envInside) != "1" {
		return false
	}
	ifs, err := net.Interfaces()
	return err == nil && len(ifs) == 1 && ifs[0].Flags&net.FlagLoopback != 0
})

// Run runs body in a fresh user and network namespace with only lo, brought
// up. Inside the namespace (a re-executed child, or a package under Main) it
// calls body(t). Outside it re-executes the test binary (same build, so -race
// carries over) running only this test, and reports the child's result on t
// without calling body: t.Fatalf with the child's output when it failed,
// t.Skip when it skipped, t.Log of its output when it passed. When unshare
// does not work the test is skipped, or fails if EGRESSD_REQUIRE_NETNS is set.
//
// Call Run at most once per test: the child runs the whole test, so a second
// Run would run the first body again. Put each isolated part in a subtest.
func Run(t *testing.T, body func(t *testing.T)) {
	t.Helper()
	if Inside() {
		bringUpLoopback(t)
		body(t)
		return
	}
	if err := probe(); err != nil {
		unavailable(t, err)
	}
	out, err := runChild(t)
	switch {
	case err != nil:
		t.Fatalf("in a loopback-only network namespace: %v\n%s", err, out)
	case strings.Contains(out, "--- SKIP: "+t.Name()+" "):
		t.Skipf("skipped in a loopback-only network namespace:\n%s", out)
	default:
		t.Logf("passed in a loopback-only network namespace:\n%s", out)
	}
}

// AddLoopbackAddr adds cidr (such as "10.0.0.5/32" or "fd00::5/128") to lo
// inside the namespace (adding it twice is fine), so a test can listen on an "internal" address that
// exists only there. It fails the test outside the namespace.
func AddLoopbackAddr(t *testing.T, cidr string) {
	t.Helper()
	if !Inside() {
		t.Fatalf("netns.AddLoopbackAddr(%q) outside the namespace: call it from the body of netns.Run", cidr)
	}
	args := []string{"addr", "add", cidr, "dev", "lo"}
	if strings.Contains(cidr, ":") {
		args = append(args, "nodad") // usable at once, no duplicate address detection
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil && !alreadyAssigned(string(out)) {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	waitLocal(t, cidr)
}

// alreadyAssigned reports whether ip's output says the address is on lo already,
// which makes adding it again a success: tests may share an address.
func alreadyAssigned(out string) bool {
	return strings.Contains(out, "already assigned") || strings.Contains(out, "File exists")
}

// waitLocal waits until the kernel routes the address of cidr as local.
// Linux inserts the local route of an IPv6 address from a work queue, so for
// a moment after `ip addr add` a SYN to it goes out as unicast and the
// connect fails with "network is unreachable".
func waitLocal(t *testing.T, cidr string) {
	t.Helper()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		t.Fatalf("netns.AddLoopbackAddr: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		out, err := exec.Command("ip", "route", "get", p.Addr().String()).CombinedOutput()
		if err == nil && strings.HasPrefix(string(out), "local ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("netns.AddLoopbackAddr(%q): not a local route after 5s: %s", cidr, out)
		}
	}
}

func bringUpLoopback(t *testing.T) {
	t.Helper()
	loOnce.Do(func() {
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			loErr = fmt.Errorf("ip link set lo up: %v\n%s", err, out)
		}
	})
	if loErr != nil {
		t.Fatal(loErr)
	}
}

// probe checks once that unshare and ip work here.
func probe() error {
	probeOnce.Do(func() {
		out, err := exec.Command("unshare", "-rn", "ip", "link", "set", "lo", "up").CombinedOutput()
		if msg := strings.TrimSpace(string(out)); err != nil && msg != "" {
			probeErr = fmt.Errorf("unshare -rn ip link set lo up: %v: %s", err, msg)
		} else if err != nil {
			probeErr = fmt.Errorf("unshare -rn ip link set lo up: %v", err)
		}
	})
	return probeErr
}

func unavailable(t *testing.T, err error) {
	t.Helper()
	if os.Getenv(envRequire) != "" {
		t.Fatalf("%s is set but a network namespace is unavailable: %v", envRequire, err)
	}
	t.Skipf("network namespace unavailable (set %s to fail instead): %v", envRequire, err)
}

// runChild runs this test alone in the namespace and returns its output.
// The child always runs verbose so its result lines can be read.
func runChild(t *testing.T) (string, error) {
	args := []string{"-rn", "--", os.Args[0], "-test.run=" + RunPattern(t.Name()), "-test.count=1", "-test.v=true"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	if dl, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(dl).String())
	}
	cmd := exec.Command("unshare", args...)
	cmd.Env = append(os.Environ(), envInside+"=1")
	out, err := cmd.CombinedOutput()
	ran := strings.Contains(string(out), "--- PASS: "+t.Name()+" ") ||
		strings.Contains(string(out), "--- SKIP: "+t.Name()+" ")
	if err == nil && !ran {
		err = fmt.Errorf("pattern %q did not run %s", RunPattern(t.Name()), t.Name())
	}
	return string(out), err
}

// RunPattern returns the -test.run pattern that selects exactly the test or
// subtest named name (as testing.T.Name reports it): each element anchored
// and quoted.
func RunPattern(name string) string {
	elems := strings.Split(name, "/")
	for i, e := range elems {
		elems[i] = "^" + regexp.QuoteMeta(e) + "$"
	}
	return strings.Join(elems, "/")
}
