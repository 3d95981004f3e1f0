package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The tests in this package run the egressd binary as a subprocess, the way
// operators and scripts do: exit codes, stdout and stderr are the contract.

func TestMain(m *testing.M) {
	os.Exit(egressdtest.Main(m, egressdtest.BuildOptions{}, (*testing.M).Run))
}

// binary is the egressd binary TestMain builds once for the package (a plain
// build: the subprocess does not need the race detector; the tests that drive it
// do run under -race).
func binary() string { return egressdtest.Binary() }

// result is one finished egressd command.
type result struct {
	stdout, stderr string
	code           int
}

// all returns stdout and stderr together, for "never appears in any output" checks.
func (r result) all() string { return r.stdout + r.stderr }

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// egressd runs the binary with args to completion (at most 30 s).
func egressd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.Exited():
		res.code = exit.ExitCode()
	default:
		t.Fatalf("egressd %q: %v\n%s", args, err, res)
	}
	return res
}

// writeFiles writes name -> content into a fresh temporary directory and
// returns the directory.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
