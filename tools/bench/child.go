package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// Bounds on a child's lifecycle, so a broken build cannot hang the bench.
const (
	startTimeout = 10 * time.Second
	// stopTimeout: every client connection is closed by SIGTERM, so a drain
	// has nothing to wait for.
	stopTimeout = 10 * time.Second
)

// child is a process the bench starts (a peer; egressd and Vault are
// internal/testutil's): in its own process group, so Ctrl-C reaches only the
// bench, which stops it with SIGTERM; Pdeathsig stops it if the bench dies.
type child struct {
	cmd              *exec.Cmd
	outPath, logPath string        // its stdout and stderr
	exited           chan struct{} // closed once reaped
	exitErr          error
	stopOnce         sync.Once
	stopMsg          string
}

func startChild(cmd *exec.Cmd, outPath, logPath string) (*child, error) {
	c := &child{cmd: cmd, outPath: outPath, logPath: logPath, exited: make(chan struct{})}
	stdout, err := os.Create(outPath)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		c.exitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// pause sleeps a little, failing if the process has exited or the wait is over.
func (c *child) pause(ctx context.Context, waitingFor string) error {
	select {
	case <-c.exited:
		return fmt.Errorf("exited while waiting for %s: %v", waitingFor, c.exitErr)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", waitingFor, ctx.Err())
	case <-time.After(20 * time.Millisecond):
		return nil
	}
}

// stop sends SIGTERM, waits up to stopTimeout, then kills. It runs once and
// returns "" when the process exited 0, otherwise how it ended.
func (c *child) stop() string {
	c.stopOnce.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
			if c.exitErr != nil {
				c.stopMsg = "after SIGTERM: " + c.exitErr.Error()
			}
		case <-time.After(stopTimeout):
			_ = c.cmd.Process.Kill()
			<-c.exited
			c.stopMsg = fmt.Sprintf("still running %s after SIGTERM; killed", stopTimeout)
		}
	})
	return c.stopMsg
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) cpuTime() (time.Duration, error) { return procfs.CPU(c.pid()) }

// logTail is the end of its stderr, for an error message.
func (c *child) logTail() string {
	b, _ := os.ReadFile(c.logPath)
	if len(b) == 0 {
		return ""
	}
	return "; it said:\n" + string(b[max(0, len(b)-1000):])
}
