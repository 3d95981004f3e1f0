// Package netns runs a test inside a fresh loopback-only network namespace.
//
// A test that dials addresses which are not on this machine (10.x,
// 169.254.169.254, fd00:ec2::254, public IPs) calls Isolate first. Isolate
// re-executes the test binary under `unshare -rn`, where the only interface
// is lo, so such a dial fails with "network is unreachable" even when the
// code under test is wrong. The test must still assert its own error, not the
// dial error.
//
//	func TestGuardBlocksMetadata(t *testing.T) {
//		netns.Isolate(t)
//		// runs only inside the namespace
//	}
package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
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
// dial out; Isolate then re-executes the test in a namespace as usual.
func Inside() bool { return inside() }

var inside = sync.OnceValue(func() bool {
	if os.Getenv(envInside) != "1" {
		return false
	}
	ifs, err := net.Interfaces()
	return err == nil && len(ifs) == 1 && ifs[0].Flags&net.FlagLoopback != 0
})

// Isolate runs the calling test in a fresh user and network namespace with
// only lo, brought up. Inside the namespace it returns at once and the test
// body runs. Outside it re-executes the test binary (same build, so -race
// carries over) running only this test, and ends the calling test with the
// child's result without running the body: FAIL with the child's output, or
// PASS with the output logged. When unshare does not work the test is
// skipped, or fails if EGRESSD_REQUIRE_NETNS is set.
func Isolate(t *testing.T) {
	t.Helper()
	if Inside() {
		bringUpLoopback(t)
		return
	}
	if err := probe(); err != nil {
		unavailable(t, err)
	}
	out, err := runChild(t)
	if err != nil {
		t.Fatalf("in a loopback-only network namespace: %v\n%s", err, out)
	}
	if strings.Contains(out, "--- SKIP: "+t.Name()+" ") {
		t.Skipf("skipped in a loopback-only network namespace:\n%s", out)
	}
	t.Logf("passed in a loopback-only network namespace:\n%s", out)
	pass(t)
}

// AddLoopbackAddr adds cidr (such as "10.0.0.5/32" or "fd00::5/128") to lo
// inside the namespace (adding it twice is fine), so a test can listen on an "internal" address that
// exists only there. It fails the test outside the namespace.
func AddLoopbackAddr(t *testing.T, cidr string) {
	t.Helper()
	if !Inside() {
		t.Fatalf("netns.AddLoopbackAddr(%q) outside the namespace: call netns.Isolate(t) first", cidr)
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

// pass ends the calling test as passed without returning to it.
//
// The testing package has no such call: runtime.Goexit alone is reported as
// "test executed panic(nil) or runtime.Goexit", and SkipNow reports SKIP. So
// pass marks the test finished the way SkipNow and FailNow do (T.finished,
// under T.mu) and then calls runtime.Goexit. If a future testing package
// renames those fields, pass falls back to SkipNow: the test then shows as
// SKIP with the child's PASS in its log, never as a false PASS or FAIL.
func pass(t *testing.T) {
	common := reflect.ValueOf(t).Elem().FieldByName("common")
	finished := common.FieldByName("finished")
	mu := common.FieldByName("mu")
	if !finished.IsValid() || finished.Kind() != reflect.Bool || !mu.IsValid() || mu.Type() != reflect.TypeFor[sync.RWMutex]() {
		t.SkipNow()
	}
	lock := (*sync.RWMutex)(unsafe.Pointer(mu.UnsafeAddr()))
	lock.Lock()
	*(*bool)(unsafe.Pointer(finished.UnsafeAddr())) = true
	lock.Unlock()
	runtime.Goexit()
}
