package egressdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/proc"
)

// Bounds on egressd's lifecycle, so that a broken build cannot hang a suite.
const (
	// DefaultStartTimeout bounds Start: the listening lines and what Wait asks for.
	DefaultStartTimeout = 20 * time.Second
	// DefaultStopTimeout bounds the wait after SIGTERM; then SIGKILL.
	DefaultStopTimeout = 15 * time.Second
	// SignalGrace is how long after "egressd started" Signal and Stop wait before
	// they signal: egressd installs its signal handlers only after that line, and
	// a signal before then kills it (cmd/egressd TestRunSignalRightAfterStart).
	SignalGrace = 250 * time.Millisecond
	// poll is the step of every wait.
	poll = 10 * time.Millisecond
)

// The files Start writes into Options.Dir.
const (
	ConfigName = "egressd.yaml"   // the config, unless Options.ConfigPath names one
	LogName    = "egressd.log"    // egressd's stdout: the JSON log
	StderrName = "egressd.stderr" // its stderr: load errors, race reports
)

// Wait is what Start waits for beyond "egressd started" and the listening lines.
type Wait int

const (
	// WaitStarted: the "egressd started" line (every listener is bound by then).
	WaitStarted Wait = iota
	// WaitHealthy: and /healthz answers 200.
	WaitHealthy
	// WaitReady: and /readyz answers 200 with "ready": true and no credential
	// whose first read is pending (the credential backend has answered).
	WaitReady
)

// Options describe one egressd run.
type Options struct {
	// Bin is the binary; "" means Binary() (Build or Main must have run).
	Bin string
	// Dir is the run's directory: the config, Files, the log and stderr are
	// written there and egressd runs in it. Required (StartT defaults it).
	Dir string
	// Config is written to Dir/egressd.yaml. RawConfig instead is written as is
	// (a test of odd YAML); ConfigPath instead names a config already written.
	Config     *Config
	RawConfig  string
	ConfigPath string
	// Files are written into Dir (name -> content, mode 0600) before the start.
	Files map[string]string
	// Args follow `run --config PATH`; Env is added to this process's.
	Args, Env []string
	// Wrap prefixes the command, to run egressd elsewhere (such as
	// `ip netns exec NAME` or `nsenter --net=PATH`).
	Wrap []string
	// LoopbackOnly refuses to start egressd unless this process runs in a
	// loopback-only network namespace (netns.Inside) or Wrap puts egressd in one:
	// for configs that name addresses not on this machine.
	LoopbackOnly bool
	// AdminToken is sent as "Authorization: Bearer <token>" to the admin listener
	// (admin.token).
	AdminToken string
	// ProxyListener is the listener whose address is Egressd.Proxy; default "sandbox".
	ProxyListener string
	// Wait is what Start waits for; StartTimeout and StopTimeout bound the
	// start and the stop (defaults above).
	Wait                      Wait
	StartTimeout, StopTimeout time.Duration
}

// Egressd is one running `egressd run`.
type Egressd struct {
	Dir        string
	ConfigPath string
	LogPath    string // stdout: the JSON log
	StderrPath string
	Proxy      string            // the ProxyListener's bound address
	Admin      string            // the admin listener's bound address
	Addrs      map[string]string // every listening line: listener name -> bound address
	Started    time.Time         // when "egressd started" was seen

	opts     Options
	p        *proc.Proc
	exited   <-chan struct{} // the process's; closed from the start for Open
	stopOnce sync.Once
	serving  struct { // ServingPid's progress through the log
		mu  sync.Mutex
		cur *Cursor
		pid int
	}
}

// Start writes the run's files, starts egressd and waits for what o.Wait asks. On
// an error the process is killed and the error ends with egressd's output.
func Start(ctx context.Context, o Options) (*Egressd, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	e := &Egressd{Dir: o.Dir, LogPath: filepath.Join(o.Dir, LogName), StderrPath: filepath.Join(o.Dir, StderrName),
		Addrs: map[string]string{}, opts: o}
	var err error
	if e.ConfigPath, err = o.writeFiles(); err != nil {
		return nil, err
	}
	if err := e.spawn(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()
	if err := e.waitStart(ctx); err != nil {
		e.Kill()
		return nil, fmt.Errorf("egressd did not start: %w%s", err, e.OutputTail(3000))
	}
	return e, nil
}

func (o *Options) check() error {
	if o.Bin == "" {
		o.Bin = Binary()
	}
	switch {
	case o.Bin == "":
		return fmt.Errorf("no egressd binary: call egressdtest.Build or Main first, or set %s", EnvBinary)
	case o.Dir == "":
		return errors.New("egressdtest.Options.Dir is empty")
	case o.LoopbackOnly && len(o.Wrap) == 0 && !netns.Inside():
		return errors.New("refusing to start egressd outside a loopback-only network namespace (Options.LoopbackOnly)")
	}
	if o.ProxyListener == "" {
		o.ProxyListener = "sandbox"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	return nil
}

// writeFiles writes Files and the config, and returns the config's path.
func (o *Options) writeFiles() (string, error) {
	files := map[string]string{}
	for name, content := range o.Files {
		files[name] = content
	}
	path := o.ConfigPath
	switch {
	case o.Config != nil:
		b, err := o.Config.YAML()
		if err != nil {
			return "", err
		}
		files[ConfigName] = string(b)
	case o.RawConfig != "":
		files[ConfigName] = o.RawConfig
	case path == "":
		return "", errors.New("egressdtest.Options has no Config, RawConfig or ConfigPath")
	}
	if _, ok := files[ConfigName]; ok && path == "" {
		path = filepath.Join(o.Dir, ConfigName)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(o.Dir, name), []byte(content), 0o600); err != nil {
			return "", err
		}
	}
	return path, nil
}

// spawn starts egressd in its own process group, SIGKILLed should this
// process die: egressd never outlives its test.
func (e *Egressd) spawn() error {
	argv := append(append(append([]string{}, e.opts.Wrap...), e.opts.Bin, "run", "--config", e.ConfigPath), e.opts.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = e.Dir
	cmd.Env = append(os.Environ(), e.opts.Env...)
	var err error
	if e.p, err = proc.Start(cmd, e.LogPath, e.StderrPath, syscall.SIGKILL); err != nil {
		return err
	}
	e.exited = e.p.Exited()
	return nil
}

// waitStart waits for "egressd started", reads the listening lines, then waits
// for what Options.Wait asks.
func (e *Egressd) waitStart(ctx context.Context) error {
	if _, err := e.Cursor(0).WaitContext(ctx, IsMessage("egressd started")); err != nil {
		return fmt.Errorf(`waiting for "egressd started": %w`, err)
	}
	e.Started = time.Now()
	if err := e.readListening(); err != nil {
		return err
	}
	for _, path := range e.waitPaths() {
		if err := e.waitAdminOK(ctx, path); err != nil {
			return err
		}
	}
	return nil
}

func (e *Egressd) readListening() error {
	lines, err := e.Lines()
	if err != nil {
		return err
	}
	for _, l := range lines {
		if l.Message() == "listening" {
			e.Addrs[l.Str("listener")] = l.Str("address")
		}
	}
	e.Proxy, e.Admin = e.Addrs[e.opts.ProxyListener], e.Addrs["admin"]
	if e.Proxy == "" {
		return fmt.Errorf("no listening line for listener %q", e.opts.ProxyListener)
	}
	if e.Admin == "" && e.opts.Wait != WaitStarted {
		return errors.New("no listening line for the admin listener")
	}
	return nil
}

func (e *Egressd) waitPaths() []string {
	switch e.opts.Wait {
	case WaitHealthy:
		return []string{"/healthz"}
	case WaitReady:
		return []string{"/healthz", "/readyz"}
	}
	return nil
}

func (e *Egressd) waitAdminOK(ctx context.Context, path string) error {
	var last error
	for {
		code, body, err := e.AdminGet(path)
		// /readyz is 200 before the credentials' first reads are done: wait for those
		// too (no credential "pending"), so a test's first request finds them read.
		if err == nil && code == 200 && !bytes.Contains(body, []byte(`"pending": true`)) {
			return nil
		}
		if last = err; err == nil {
			last = fmt.Errorf("status %d", code)
		}
		if err := e.pause(ctx); err != nil {
			return fmt.Errorf("waiting for %s (last: %v): %w", path, last, err)
		}
	}
}

// pause waits one poll step, or fails when egressd exited or ctx ended.
func (e *Egressd) pause(ctx context.Context) error {
	select {
	case <-e.exited:
		return fmt.Errorf("egressd exited (%d): %v", e.exitCode(), e.p.Err())
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(poll):
		return nil
	}
}
