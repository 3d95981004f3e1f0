package egressdtest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// EnvBinary names the egressd binary under test. When it is set, Build builds
// nothing; Build sets it, so a re-executed test binary (netns) finds it too.
const EnvBinary = "EGRESSD_BIN"

// pkg is what Build builds.
const pkg = "github.com/egressd/egressd/cmd/egressd"

// BuildOptions shape the one build of a process.
type BuildOptions struct {
	// Prebuilt is a binary to use as is (a suite's own variable or flag, such
	// as make's bin/egressd); "" falls back to EnvBinary, then to building.
	Prebuilt string
	// Race builds with -race, so egressd's own data races fail the run (see
	// Egressd.Faults). RaceEnabled says whether this test binary has it.
	Race bool
	// Static builds as make build does: CGO_ENABLED=0, -trimpath.
	Static bool
}

// Build returns the egressd binary for this process: Prebuilt, else EnvBinary,
// else one built into a temporary directory. It sets EnvBinary to the absolute
// path and returns the function that removes what it built.
func Build(o BuildOptions) (string, func(), error) {
	if bin := firstNonEmpty(o.Prebuilt, os.Getenv(EnvBinary)); bin != "" {
		return usePrebuilt(bin)
	}
	dir, err := os.MkdirTemp("", "egressdtest-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	bin := filepath.Join(dir, "egressd")
	if err := goBuild(bin, o); err != nil {
		cleanup()
		return "", nil, err
	}
	if err := os.Setenv(EnvBinary, bin); err != nil {
		cleanup()
		return "", nil, err
	}
	return bin, cleanup, nil
}

func usePrebuilt(bin string) (string, func(), error) {
	abs, err := filepath.Abs(bin)
	if err == nil {
		_, err = os.Stat(abs)
	}
	if err == nil {
		err = os.Setenv(EnvBinary, abs)
	}
	return abs, func() {}, err
}

func goBuild(bin string, o BuildOptions) error {
	return BuildPackage(pkg, bin, o)
}

// BuildPackage builds the command pkg (an import path) into bin, as o says.
func BuildPackage(pkg, bin string, o BuildOptions) error {
	args := []string{"build", "-o", bin}
	if o.Race {
		args = append(args, "-race")
	}
	if o.Static {
		args = append(args, "-trimpath")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	if o.Static {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, out)
	}
	return nil
}

// Main is the TestMain of a package whose tests run egressd: it builds the
// binary (Build), calls run (m.Run, or netns.Main to run the package in a
// loopback-only namespace), removes what it built and returns run's exit code.
// Listing the tests (-test.list, as scripts/fuzz.sh does) builds nothing.
func Main(m *testing.M, o BuildOptions, run func(*testing.M) int) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	_, cleanup, err := Build(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "egressdtest: building egressd: %v\n", err)
		return 1
	}
	defer cleanup()
	return run(m)
}

// Binary returns the binary Build chose (EnvBinary), or "" before Build.
func Binary() string { return os.Getenv(EnvBinary) }

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
