// Package proc runs a helper process for the suites and the bench (egressd,
// Vault, a peer proxy): in its own process group, so that a Ctrl-C reaches
// only the parent, which stops it; signalled should the parent die, so that
// it never outlives it; stopped with SIGTERM, then SIGKILL.
package proc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is one started process.
type Proc struct {
	Cmd      *exec.Cmd
	exited   chan struct{}
	err      error // cmd.Wait's, set before exited is closed
	stopOnce sync.Once
	stopMsg  string
}

// Start starts cmd with its stdout in the file outPath and its stderr in
// errPath ("" leaves that stream as cmd has it); deathSig reaches it should
// this process die.
func Start(cmd *exec.Cmd, outPath, errPath string, deathSig syscall.Signal) (*Proc, error) {
	for _, f := range []struct {
		path string
		w    *io.Writer
	}{{outPath, &cmd.Stdout}, {errPath, &cmd.Stderr}} {
		if f.path == "" {
			continue
		}
		file, err := os.Create(f.path)
		if err != nil {
			return nil, err
		}
		defer file.Close() // the child has its own descriptor
		*f.w = file
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	p := &Proc{Cmd: cmd, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Pid is the process's ID.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Exited is closed once the process has exited and Err is set.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err waits for the exit and returns how it ended: nil for exit 0.
func (p *Proc) Err() error { <-p.exited; return p.err }

// ExitCode waits for the exit: the code, -1 when a signal ended it, -2 when it
// could not be waited for.
func (p *Proc) ExitCode() int {
	var exit *exec.ExitError
	switch err := p.Err(); {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	return -2
}

// Alive reports whether the process is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Pause waits step, or fails when the process exited or ctx ended first.
func (p *Proc) Pause(ctx context.Context, step time.Duration) error {
	select {
	case <-p.exited:
		return fmt.Errorf("exited (%d): %v", p.ExitCode(), p.err)
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(step):
		return nil
	}
}

// Kill kills the process group, if the process still runs, and waits for the exit.
func (p *Proc) Kill() {
	if p.Alive() {
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	}
	<-p.exited
}

// Stop sends SIGTERM, waits up to within for the exit, then kills. Only the
// first call stops; every call returns "" when the process exited 0, else how
// it ended.
func (p *Proc) Stop(within time.Duration) string {
	p.stopOnce.Do(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
			if p.err != nil {
				p.stopMsg = "after SIGTERM: " + p.err.Error()
			}
		case <-time.After(within):
			p.Kill()
			p.stopMsg = fmt.Sprintf("still running %s after SIGTERM; killed", within)
		}
	})
	return p.stopMsg
}

// Tail is the end of the file at path, about n bytes, "…" first when cut.
func Tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) <= n {
		return string(b)
	}
	return "…" + string(b[len(b)-n:])
}
