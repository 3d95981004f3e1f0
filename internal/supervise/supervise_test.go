package supervise

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBackoff: workers that keep dying young wait 100 ms, then twice as long
// each time, never more than 2 s, however many deaths.
func TestBackoff(t *testing.T) {
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 2 * time.Second, 2 * time.Second}
	for i, w := range want {
		if got := backoff(i + 1); got != w {
			t.Errorf("backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	for _, n := range []int{64, 1000, 1 << 30} {
		if got := backoff(n); got != restartMax {
			t.Errorf("backoff(%d) = %v, want %v", n, got, restartMax)
		}
	}
}

// TestExitCode: the parent exits with the worker's code; a worker ended by the
// stop signal before it could handle it exited cleanly; another signal is
// 128 + its number, as a shell says.
func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		script   string
		stopping bool
		want     int
	}{
		{"exit 0", true, 0},
		{"exit 2", false, 2},
		{"kill -TERM $$", true, 0},
		{"kill -TERM $$", false, 143},
		{"kill -KILL $$", true, 137},
	} {
		cmd := exec.Command("sh", "-c", tc.script)
		cmd.Run()
		if got := exitCode(cmd.ProcessState, tc.stopping); got != tc.want {
			t.Errorf("%q (stopping %v): exit code %d, want %d", tc.script, tc.stopping, got, tc.want)
		}
	}
}

// TestWorkerEnv: a worker gets the parent's environment without systemd's
// notification socket (the main process's alone) and the worker protocol's
// variables, which the parent sets afresh.
func TestWorkerEnv(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	t.Setenv(EnvReport, "9")
	t.Setenv("EGRESSD_TEST_KEEP", "1")
	env := workerEnv()
	if !slices.Contains(env, "EGRESSD_TEST_KEEP=1") {
		t.Error("the worker's environment lost a variable")
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "NOTIFY_SOCKET=") || strings.HasPrefix(kv, EnvReport+"=") {
			t.Errorf("the worker's environment has %s", kv)
		}
	}
}
