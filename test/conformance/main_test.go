// Package conformance_test is egressd's attack-class conformance suite: one named
// case per attack, over real sockets, against the real egressd binary (built once
// by TestMain) running as a subprocess on a generated config.
//
// Invariant: nothing leaves the machine, even when egressd is wrong. The whole
// package runs inside a loopback-only network namespace it makes itself
// (netns.Main), and every address a case names (the stand-in public upstreams, the
// canaries on internal addresses) is added to lo inside that namespace. README.md
// lists every case with what it expects.
package conformance_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/egressd/egressd/internal/testutil/netns"
)

// envBinary names the egressd binary under test. TestMain builds one and sets it
// before entering the namespace (where the Go toolchain may not reach the module
// proxy); set it yourself to test a binary you built.
const envBinary = "EGRESSD_CONFORMANCE_BIN"

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		os.Exit(m.Run()) // listing tests (scripts/fuzz.sh does) needs no binary and no namespace
	}
	cleanup, err := ensureBinary()
	if err != nil {
		fmt.Fprintf(os.Stderr, "conformance: building egressd: %v\n", err)
		os.Exit(1)
	}
	code := netns.Main(m)
	if netns.Inside() && code == 0 {
		code = checkSinksUntouched()
	}
	cleanup()
	os.Exit(code)
}

// ensureBinary builds egressd into a temporary directory unless envBinary already
// names one, and returns the function that removes what it built. A test binary
// built with -race builds egressd with -race too, and every egressd run fails its
// test on a race report.
func ensureBinary() (func(), error) {
	if os.Getenv(envBinary) != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "egressd-conformance-bin-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "egressd")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "github.com/egressd/egressd/cmd/egressd")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	if err := os.Setenv(envBinary, bin); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return func() { os.RemoveAll(dir) }, nil
}
