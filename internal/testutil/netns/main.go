package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Main runs a whole test package inside one loopback-only network namespace. Use it
// from TestMain when every test in the package names addresses that must not be
// reachable outside the machine:
//
//	func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }
//
// Outside the namespace it re-executes the test binary with the same arguments
// under `unshare -rnm` (user, network and mount namespaces: the mount namespace lets
// tests make further namespaces with `ip netns add`) and returns its exit code;
// inside it brings lo up and runs the
// tests. When no namespace can be made the package is skipped with a message, or
// fails if EGRESSD_REQUIRE_NETNS is set.
func Main(m *testing.M) int {
	if Inside() {
		if err := privateMounts(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: making mounts private: %v\n", err)
			return 1
		}
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: ip link set lo up: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}
	if err := probe(); err != nil {
		fmt.Fprintf(os.Stderr, "netns: no loopback-only network namespace: %v\n", err)
		if os.Getenv(envRequire) != "" {
			return 1
		}
		fmt.Println("SKIP: these tests run only inside a network namespace (unshare -rn)")
		return 0
	}
	cmd := reexec()
	cmd.Env = append(os.Environ(), envInside+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "netns: %v\n", err)
		return 1
	}
}

// reexec runs this test binary again in new user, network and mount namespaces,
// as `unshare -rnm` does. As root, the user namespace maps the first 65,536 UIDs
// and GIDs to themselves (root may write such a map itself), so a test can run a
// process as another user, a sandbox's code beside its runtime; else only the
// caller's own, as root.
func reexec() *exec.Cmd {
	if os.Geteuid() != 0 {
		return exec.Command("unshare", append([]string{"-rnm", "--", os.Args[0]}, os.Args[1:]...)...)
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
		UidMappings: ids, GidMappings: ids, GidMappingsEnableSetgroups: true,
	}
	return cmd
}

// privateMounts makes every mount private to this mount namespace, as unshare
// does when it makes one: nothing a test mounts reaches the host's.
func privateMounts() error {
	return syscall.Mount("none", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "")
}
