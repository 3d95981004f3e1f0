// Package node_test runs a node-mode egressd (the real binary, built by TestMain)
// serving several sandboxes, each in a network namespace of its own whose REDIRECT
// rules send its TCP 80 and 443 to the transparent listener egressd opened inside
// that namespace. Everything runs inside a loopback-only network namespace the
// package makes itself (netns.Main): the upstreams' names resolve, through a stub
// DNS server, to loopback addresses there, so nothing leaves the machine.
package node_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

func TestMain(m *testing.M) {
	build := egressdtest.BuildOptions{Prebuilt: os.Getenv("EGRESSD_NODE_BIN"), Race: egressdtest.RaceEnabled}
	os.Exit(egressdtest.Main(m, build, func(m *testing.M) int {
		if netns.Inside() {
			if err := netns.PrivateNetnsDirs(); err != nil {
				fmt.Fprintln(os.Stderr, "node:", err)
				return 1
			}
		}
		return netns.Main(m)
	}))
}
