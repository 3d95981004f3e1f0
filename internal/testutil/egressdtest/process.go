package egressdtest

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Pid is egressd's process ID: the process Start started, which the signals go
// to. Under the supervisor (the default) that is the parent, which serves
// nothing; ServingPid is the process that serves.
func (e *Egressd) Pid() int { return e.p.Pid() }

// ServingPid is the process that serves connections, whose memory, descriptors
// and CPU time are egressd's figures: the worker that logged the last "egressd
// started" line (its "pid" field), or Pid when there is no such line (an egressd
// run with --no-supervise logs its own PID there too). It reads only the log
// written since its last call.
func (e *Egressd) ServingPid() int {
	e.serving.mu.Lock()
	defer e.serving.mu.Unlock()
	if e.serving.cur == nil {
		e.serving.cur = &Cursor{e: e, Skip: func(b []byte) bool { return !bytes.Contains(b, startedMarker) }}
	}
	lines, _ := e.serving.cur.Next()
	for _, l := range lines {
		if l.Message() == "egressd started" && l.Num("pid") > 0 {
			e.serving.pid = int(l.Num("pid"))
		}
	}
	if e.serving.pid == 0 {
		return e.Pid()
	}
	return e.serving.pid
}

// startedMarker finds the "egressd started" lines without decoding the others.
var startedMarker = []byte(`"message":"egressd started"`)

// Exited is closed once egressd has exited; ExitCode is valid then.
func (e *Egressd) Exited() <-chan struct{} { return e.exited }

// ExitCode is the exit code once Exited is closed: -1 when killed by a signal.
func (e *Egressd) ExitCode() int { <-e.exited; return e.exitCode() }

// exitCode is the process's exit code (0 for Open's, which has none).
func (e *Egressd) exitCode() int {
	if e.p == nil {
		return 0
	}
	return e.p.ExitCode()
}

// Alive reports whether egressd is still running.
func (e *Egressd) Alive() bool { return e.p != nil && e.p.Alive() }

// Signal sends sig once SignalGrace has passed since "egressd started".
func (e *Egressd) Signal(sig syscall.Signal) error {
	time.Sleep(time.Until(e.Started.Add(SignalGrace)))
	return e.SignalNow(sig)
}

// SignalNow sends sig at once, grace or not.
func (e *Egressd) SignalNow(sig syscall.Signal) error { return e.p.Cmd.Process.Signal(sig) }

// Wait waits up to within for the exit and returns the exit code.
func (e *Egressd) Wait(within time.Duration) (int, error) {
	select {
	case <-e.exited:
		return e.exitCode(), nil
	case <-time.After(within):
		return 0, fmt.Errorf("egressd still running %v later", within)
	}
}

// Stop sends SIGTERM (after SignalGrace) and waits up to Options.StopTimeout for
// the exit, then kills. It returns the exit code, and an error when egressd had
// exited before or had to be killed. Only the first call stops; later ones
// return the same code.
func (e *Egressd) Stop() (code int, err error) {
	e.stopOnce.Do(func() {
		if !e.Alive() {
			err = fmt.Errorf("egressd had exited (%d) before SIGTERM", e.exitCode())
			return
		}
		_ = e.Signal(syscall.SIGTERM)
		if _, werr := e.Wait(e.opts.StopTimeout); werr != nil {
			e.Kill()
			err = fmt.Errorf("egressd still running %v after SIGTERM; killed", e.opts.StopTimeout)
		}
	})
	return e.ExitCode(), err
}

// Kill kills egressd's process group, if it still runs, and waits for the exit.
func (e *Egressd) Kill() {
	if e.p != nil {
		e.p.Kill()
	}
}

// Stderr is what egressd wrote to stderr so far.
func (e *Egressd) Stderr() []byte {
	b, _ := os.ReadFile(e.StderrPath)
	return b
}

// Faults lists what egressd must never do, as found in its output so far: a
// data race report (with a -race build) and a recovered panic.
func (e *Egressd) Faults() []string {
	var out []string
	if stderr := e.Stderr(); bytes.Contains(stderr, []byte("WARNING: DATA RACE")) {
		out = append(out, fmt.Sprintf("egressd reported a data race:\n%s", stderr))
	}
	lines, _ := e.Lines()
	for _, l := range lines {
		if strings.Contains(l.Message(), "panic") {
			out = append(out, fmt.Sprintf("egressd recovered a panic: %v", l))
		}
	}
	return out
}

// OutputTail is the end (about n bytes) of egressd's stderr and log, for an error.
func (e *Egressd) OutputTail(n int) string {
	b := append(e.Stderr(), e.LogBytes()...)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; egressd said:\n" + string(b)
}

// WaitDead waits until process pid has exited (a zombie its parent has yet to
// reap, or gone), so its descriptors are closed: a connection made afterwards
// can no longer be accepted by it and die with it.
func WaitDead(t testing.TB, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still runs 5s after it was killed", pid)
		}
	}
}
