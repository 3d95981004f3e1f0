// Package conformance_test is egressd's attack-class conformance suite: one named
// case per attack, over real sockets, against the real egressd binary (built once
// by TestMain, internal/testutil/egressdtest) running as a subprocess on a
// generated config.
//
// Invariant: nothing leaves the machine, even when egressd is wrong. The whole
// package runs inside a loopback-only network namespace it makes itself
// (netns.Main), egressd is started only there (egressdtest.Options.LoopbackOnly),
// and every address a case names (the stand-in public upstreams, the canaries on
// internal addresses) is added to lo inside that namespace. README.md lists every
// case with what it expects.
package conformance_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/hookflood"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// envBinary names an egressd binary to test instead of building one; TestMain
// builds egressd before entering the namespace (where the Go toolchain may not
// reach the module proxy). A test binary built with -race builds egressd with -race
// too, and every egressd run fails its test on a race report.
const envBinary = "EGRESSD_CONFORMANCE_BIN"

func TestMain(m *testing.M) {
	hookflood.MainIfChild() // a child the fake-call flood runs in (hookflood_test.go)
	build := egressdtest.BuildOptions{Prebuilt: os.Getenv(envBinary), Race: egressdtest.RaceEnabled}
	os.Exit(egressdtest.Main(m, build, func(m *testing.M) int {
		if !netns.Inside() {
			cleanup, err := buildLoadBinaries()
			if err != nil {
				fmt.Fprintln(os.Stderr, "conformance:", err)
				return 1
			}
			defer cleanup()
		}
		code := netns.Main(m)
		if netns.Inside() && code == 0 {
			code = checkSinksUntouched()
		}
		return code
	}))
}
