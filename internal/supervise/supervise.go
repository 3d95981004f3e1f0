// Package supervise is egressd's supervising parent, as nginx's master process is:
// it holds the listening sockets (package sockets) and runs the process that
// serves them, the worker, as its child: the same binary, with the sockets
// inherited. The runtime treats a hook call that fails to connect as "allow", so
// egressd must never be absent from its ports: a worker that dies (a crash,
// SIGKILL, the OOM killer) leaves the sockets open here, connections wait in the
// kernel's backlog, and a new worker is started at once (after a short back-off
// only when workers keep dying young). SIGTERM and SIGINT are passed on (the
// worker drains) and the parent exits with the worker's status; SIGHUP is passed
// on (reload); SIGUSR2 starts a worker from the binary now at the same path and,
// once it is ready, drains the old one: an upgrade with the same sockets.
//
// In node mode the parent also keeps what each worker leaves with it (package
// keep): the sockets opened inside sandboxes' namespaces and the sandbox specs in
// force, so that a worker's death frees no sandbox's port and
// forgets no registration.
//
// The parent parses no request and holds no secret: it reads the config only for
// the addresses it listens on, and afterwards only waits for signals and for its
// children; what workers leave with it, it holds without reading. docs/configuration.md ("Process model") is the user's view.
package supervise

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/keep"
	"github.com/egressd/egressd/internal/sockets"
)

// Timing of restarts and upgrades.
const (
	// stableAfter is how long a worker must have served for its death to be a
	// one-off, restarted at once. One that dies sooner (a crash at start, a
	// request that crashes every worker) is restarted after a back-off.
	stableAfter = time.Second
	// restartStep is the first back-off; it doubles with each young death, up
	// to restartMax. Connections wait in the backlog meanwhile: the bound keeps
	// a crash loop from spinning without leaving them waiting long.
	restartStep = 100 * time.Millisecond
	restartMax  = 2 * time.Second
	// upgradeTimeout bounds how long an upgrade waits for the new worker to be
	// ready (its credential backend answered); past it the upgrade is abandoned
	// and the running worker keeps serving.
	upgradeTimeout = 60 * time.Second
)

// Options configure Run.
type Options struct {
	// Exe is the binary workers run. Each start executes the file now at this
	// path, so an upgrade (SIGUSR2) runs a binary installed since.
	Exe  string
	Args []string // the workers' arguments
	// Files are the sockets, handed to each worker (sockets.Set.Handover), and
	// SocketsEnv the sockets.EnvWorker value that names them.
	Files      []*os.File
	SocketsEnv string
	// Signals delivers SIGTERM, SIGINT, SIGHUP and SIGUSR2 (signal.Notify, done by
	// the caller first thing, so that none arrives unhandled).
	Signals <-chan os.Signal
	Log     zerolog.Logger
	// Notify tells the service manager (systemd's sd_notify) "READY=1" once the
	// first worker serves and "STOPPING=1" at the stop; nil tells nothing.
	Notify func(state string)
}

// Run starts the first worker and supervises it and its successors until
// egressd stops; it returns the exit code: the worker's when it stopped on
// SIGTERM or SIGINT, or when the first worker failed to start.
func Run(o Options) int {
	s := &supervisor{o: o, events: make(chan event, 16), kept: keep.NewStore()}
	if s.o.Notify == nil {
		s.o.Notify = func(string) {}
	}
	w, err := s.spawn(false)
	if err != nil {
		o.Log.Error().Err(err).Msg("egressd failed to start its worker")
		return exitRuntime
	}
	s.current = w
	return s.loop()
}

// exitRuntime is egressd's exit code for a runtime failure (cmd/egressd).
const exitRuntime = 2

// supervisor is Run's state; only loop's goroutine touches it.
type supervisor struct {
	o      Options
	events chan event
	kept   *keep.Store // what workers leave with the parent

	current *worker   // the serving (or starting) worker; nil while a restart waits
	next    *worker   // an upgrade's worker, until it is ready
	old     []*worker // workers draining after an upgrade

	served   bool // the first worker has started serving
	stopping bool
	code     int // the exit code, once stopping
	young    int // consecutive deaths of young workers: the back-off's exponent
	restarts int

	restart *time.Timer // a pending restart
	upgrade *time.Timer // the upgrade's deadline
}

// worker is one child process.
type worker struct {
	cmd     *exec.Cmd
	pid     int
	started time.Time // when it reported that it serves; zero before
}

func (w *worker) signal(sig os.Signal) { _ = w.cmd.Process.Signal(sig) }

// event is a worker's report (reportStarted, reportReady) or its exit.
type event struct {
	w    *worker
	kind byte
}

const exited = 'x'

func (s *supervisor) loop() int {
	for {
		select {
		case sig := <-s.o.Signals:
			s.signal(sig)
		case ev := <-s.events:
			s.event(ev)
		case <-timerC(s.restart):
			s.restart = nil
			s.respawn()
		case <-timerC(s.upgrade):
			s.upgrade = nil
			s.abandonUpgrade()
		}
		if s.stopping && s.current == nil && s.next == nil && len(s.old) == 0 {
			return s.code
		}
	}
}

// timerC is t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

func (s *supervisor) signal(sig os.Signal) {
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT:
		s.stop()
		for _, w := range s.live() {
			w.signal(sig)
		}
	case syscall.SIGHUP:
		for _, w := range []*worker{s.current, s.next} {
			if w != nil {
				w.signal(sig)
			}
		}
	case syscall.SIGUSR2:
		s.startUpgrade()
	}
}

// stop ends supervision: no restart from now on, and the parent's copies of the
// sockets are closed, so that new connections are refused once the workers have
// closed theirs (they stop accepting as they drain), as a single process would.
func (s *supervisor) stop() {
	if s.stopping {
		return
	}
	s.stopping = true
	s.o.Notify("STOPPING=1")
	stopTimer(&s.restart)
	stopTimer(&s.upgrade)
	for _, f := range s.o.Files {
		f.Close()
	}
	s.kept.Close()
}

func stopTimer(t **time.Timer) {
	if *t != nil {
		(*t).Stop()
		*t = nil
	}
}

// live is every worker that has not exited.
func (s *supervisor) live() []*worker {
	out := slices.Clone(s.old)
	for _, w := range []*worker{s.current, s.next} {
		if w != nil {
			out = append(out, w)
		}
	}
	return out
}

func (s *supervisor) event(ev event) {
	switch ev.kind {
	case reportStarted:
		ev.w.started = time.Now()
		if ev.w == s.current && !s.served {
			s.served = true
			s.o.Notify("READY=1")
		}
	case reportReady:
		if ev.w == s.next {
			s.promote()
		}
	case exited:
		s.exited(ev.w)
	}
}

// exited handles a worker's exit: the serving worker's is restarted (unless
// egressd is stopping), an upgrade's ends the upgrade, an old one's is logged.
func (s *supervisor) exited(w *worker) {
	state := w.cmd.ProcessState
	switch {
	case w == s.next:
		s.next = nil
		stopTimer(&s.upgrade)
		if !s.stopping {
			s.o.Log.Error().Int("pid", w.pid).Str("status", state.String()).
				Msg("upgrade failed: the new worker exited before it was ready; the running worker keeps serving")
		}
	case w == s.current:
		s.current = nil
		switch {
		case s.stopping:
			s.code = exitCode(state, true)
		case !s.served:
			// The first worker could not start (its own log says why): egressd
			// fails to start, as a single process would.
			s.stop()
			s.code = exitCode(state, false)
			for _, o := range s.live() {
				o.signal(syscall.SIGTERM)
			}
		case s.next != nil:
			s.current, s.next = s.next, nil
			stopTimer(&s.upgrade)
			s.o.Log.Warn().Int("pid", w.pid).Str("status", state.String()).Int("next_pid", s.current.pid).
				Msg("worker exited during an upgrade; the new worker takes over")
		default:
			s.scheduleRestart(w, state)
		}
	default:
		s.old = slices.DeleteFunc(s.old, func(o *worker) bool { return o == w })
		s.o.Log.Info().Int("pid", w.pid).Str("status", state.String()).Msg("previous worker exited")
	}
}

// scheduleRestart logs the serving worker's death, with its status, and starts
// its successor: at once, or after the back-off when workers keep dying young.
func (s *supervisor) scheduleRestart(w *worker, state *os.ProcessState) {
	if !w.started.IsZero() && time.Since(w.started) >= stableAfter {
		s.young = 0
	}
	delay := time.Duration(0)
	if s.young > 0 {
		delay = backoff(s.young)
	}
	s.young++
	s.restarts++
	s.o.Log.Warn().Int("pid", w.pid).Str("status", state.String()).Dur("restart_in", delay).Int("restarts", s.restarts).
		Msg("worker exited; restarting it (the sockets stay open)")
	if delay == 0 {
		s.respawn()
		return
	}
	s.restart = time.NewTimer(delay)
}

// backoff is the wait before the nth restart of workers that keep dying young
// (n >= 1): restartStep doubled n-1 times, at most restartMax.
func backoff(n int) time.Duration {
	return min(restartStep<<min(n-1, 8), restartMax)
}

// respawn starts the serving worker again. A worker that cannot even be
// started (the binary gone, no memory to fork) is tried again after the
// back-off, for as long as it takes: the sockets stay open meanwhile.
func (s *supervisor) respawn() {
	w, err := s.spawn(false)
	if err != nil {
		s.young++
		delay := backoff(s.young)
		s.o.Log.Error().Err(err).Dur("restart_in", delay).Msg("cannot start a worker; trying again")
		s.restart = time.NewTimer(delay)
		return
	}
	s.current = w
}

// startUpgrade starts a worker from the binary now on disk, which takes over
// once it is ready (promote).
func (s *supervisor) startUpgrade() {
	switch {
	case s.stopping:
		return
	case s.next != nil:
		s.o.Log.Warn().Int("pid", s.next.pid).Msg("SIGUSR2 ignored: an upgrade is under way")
		return
	}
	if s.current == nil { // a restart is waiting: the new binary serves at once
		stopTimer(&s.restart)
		s.respawn()
		return
	}
	w, err := s.spawn(true)
	if err != nil {
		s.o.Log.Error().Err(err).Msg("upgrade failed: cannot start the new worker; the running worker keeps serving")
		return
	}
	s.o.Log.Info().Int("pid", w.pid).Int("previous_pid", s.current.pid).Msg("upgrade: new worker started")
	s.next = w
	s.upgrade = time.NewTimer(upgradeTimeout)
}

// promote makes the upgrade's worker, now ready and serving, the serving one,
// and drains the previous one.
func (s *supervisor) promote() {
	prev := s.current
	s.current, s.next = s.next, nil
	stopTimer(&s.upgrade)
	prev.signal(syscall.SIGTERM)
	s.old = append(s.old, prev)
	s.o.Log.Info().Int("pid", s.current.pid).Int("previous_pid", prev.pid).
		Msg("upgrade: the new worker serves; the previous one drains")
}

// abandonUpgrade stops an upgrade whose worker did not become ready in time.
// It has served nothing (a worker started for an upgrade serves only once
// ready): it stops at once.
func (s *supervisor) abandonUpgrade() {
	w := s.next
	s.next = nil
	w.signal(syscall.SIGTERM)
	s.old = append(s.old, w)
	s.o.Log.Error().Int("pid", w.pid).Dur("waited", upgradeTimeout).
		Msg("upgrade abandoned: the new worker was not ready in time; the running worker keeps serving")
}

// exitCode is the parent's exit code for a worker's exit: its own code; 0 when
// egressd was stopping and the stop signal itself ended it (it arrived before
// the worker could handle it: there was nothing to drain); else 128 + the signal,
// as a shell reports it.
func exitCode(state *os.ProcessState, stopping bool) int {
	ws, ok := state.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		return exitRuntime
	case ws.Exited():
		return ws.ExitStatus()
	case stopping && (ws.Signal() == syscall.SIGTERM || ws.Signal() == syscall.SIGINT):
		return 0
	}
	return 128 + int(ws.Signal())
}

// spawn starts a worker; upgrade asks it to serve only once ready.
func (s *supervisor) spawn(upgrade bool) (*worker, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer wr.Close() // the worker has its own copy
	kept, err := s.kept.Attach()
	if err != nil {
		r.Close()
		return nil, err
	}
	defer kept.Close()
	cmd := exec.Command(s.o.Exe, s.o.Args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = append(slices.Clone(s.o.Files), wr, kept)
	cmd.Env = append(workerEnv(),
		sockets.EnvWorker+"="+s.o.SocketsEnv,
		fmt.Sprintf("%s=%d", EnvReport, 3+len(s.o.Files)),
		fmt.Sprintf("%s=%d", keep.EnvFD, 4+len(s.o.Files)))
	if upgrade {
		cmd.Env = append(cmd.Env, EnvUpgrade+"=1")
	}
	// Should the parent die (SIGKILL), the worker drains and exits rather than
	// serve on unsupervised: the service manager then starts egressd again.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	w := &worker{cmd: cmd}
	if err := s.start(w, r); err != nil {
		r.Close()
		return nil, err
	}
	return w, nil
}

// start starts w's process and, in the background, reads its reports from r and
// then waits for its exit, each an event.
func (s *supervisor) start(w *worker, r *os.File) error {
	started := make(chan error, 1)
	go func() {
		// Pdeathsig is sent when the thread that started the child exits, not the
		// process: this goroutine keeps its thread until the worker has exited.
		runtime.LockOSThread()
		err := w.cmd.Start()
		started <- err
		if err != nil {
			return
		}
		reports := make(chan struct{})
		go s.readReports(w, r, reports)
		w.cmd.Wait()
		<-reports // every report before the exit
		s.events <- event{w, exited}
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting %s: %w", s.o.Exe, err)
	}
	w.pid = w.cmd.Process.Pid
	return nil
}

// readReports turns each byte w writes on its report pipe into an event, until
// the pipe closes (w has exited).
func (s *supervisor) readReports(w *worker, r *os.File, done chan<- struct{}) {
	defer close(done)
	defer r.Close()
	b := make([]byte, 1)
	for {
		n, err := r.Read(b)
		if n == 1 && (b[0] == reportStarted || b[0] == reportReady) {
			s.events <- event{w, b[0]}
		}
		if err != nil {
			return
		}
	}
}

// workerEnv is the parent's environment without what is the parent's alone:
// systemd's notification socket (only the main process may use it).
func workerEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, key := range []string{"NOTIFY_SOCKET", sockets.EnvWorker, EnvReport, EnvUpgrade, keep.EnvFD} {
			if strings.HasPrefix(kv, key+"=") {
				return true
			}
		}
		return false
	})
}
