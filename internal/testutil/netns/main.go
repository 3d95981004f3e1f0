package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	cmd := exec.Command("unshare", append([]string{"-rnm", "--", os.Args[0]}, os.Args[1:]...)...)
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
