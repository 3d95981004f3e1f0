package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	sd "github.com/coreos/go-systemd/v22/daemon"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/keep"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/sockets"
	"github.com/egressd/egressd/internal/supervise"
)

// cmdRun is `egressd run`: by default a supervising parent that holds the
// sockets and runs the serving process as its worker (internal/supervise); with
// --no-supervise, one process that serves. The worker is this command again,
// told so by its environment.
func cmdRun(args []string) int {
	// Take the signals before anything starts, so a SIGTERM or SIGHUP that arrives
	// during start-up is handled rather than killing the process.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	rep := supervise.Worker()
	inherited, err := sockets.FromEnv()
	kept, kerr := keep.Worker()
	fs, cfgPath, _ := newFlags("run", stderr)
	single := fs.Bool("no-supervise", false, "serve in this one process: no parent holds the sockets or restarts it (debugging; an outer supervisor)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	l, lerr := daemon.Load(*cfgPath)
	if lerr != nil {
		printLoadError(stderr, lerr)
		return exitUsage
	}
	log := newLogger(l.Cfg.Log)
	switch {
	case errors.Join(err, kerr) != nil:
		log.Error().Err(errors.Join(err, kerr)).Msg("egressd failed to start")
		return exitRuntime
	case rep != nil || *single:
		return serve(*cfgPath, l, log, sigs, worker{inherited, kept, rep})
	}
	return superviseWorkers(*cfgPath, l, log, sigs)
}

// worker is what a supervising parent gave this process: nothing at all with
// --no-supervise.
type worker struct {
	inherited *sockets.Set        // the sockets it holds
	kept      *keep.Keeper        // what earlier workers left with it, and where to leave more
	rep       *supervise.Reporter // where to report serving and ready
}

// serve runs the daemon in this process until SIGTERM or SIGINT; SIGHUP reloads.
// Under the supervisor, it serves the inherited sockets and reports to rep.
func serve(cfgPath string, l *daemon.Loaded, log zerolog.Logger, sigs <-chan os.Signal, w worker) int {
	rep := w.rep
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	hup := make(chan os.Signal, 1)
	go func() {
		for sig := range sigs {
			switch sig {
			case syscall.SIGHUP:
				hup <- sig
			case syscall.SIGUSR2:
				log.Warn().Msg("SIGUSR2 ignored: only the supervising parent upgrades (this egressd runs with --no-supervise or is a worker)")
			default:
				stop()
			}
		}
	}()
	m := metrics.New()
	m.SetBuild(version, commit)
	d := daemon.New(cfgPath, log, m)
	d.UseSockets(w.inherited)
	d.UseKeeper(w.kept)
	if rep != nil && rep.Upgrade {
		d.HoldUntilReady(ctx)
	}
	if err := d.Start(l); err != nil {
		log.Error().Err(err).Msg("egressd failed to start")
		return exitRuntime
	}
	rep.Started()
	if rep != nil {
		go func() {
			if d.WaitReady(ctx) {
				rep.Ready()
			}
		}()
	}
	if err := d.Run(ctx, hup); err != nil {
		return exitRuntime
	}
	return exitOK
}

// superviseWorkers is the supervising parent: it opens every socket (or takes
// them from systemd's socket activation), hands them to a worker and supervises
// it until egressd stops. It keeps nothing of the config but the sockets.
func superviseWorkers(cfgPath string, l *daemon.Loaded, log zerolog.Logger, sigs <-chan os.Signal) int {
	files, env, err := parentSockets(cfgPath, l, log)
	if err != nil {
		log.Error().Err(err).Msg("egressd failed to start")
		return exitRuntime
	}
	exe, err := os.Executable()
	if err != nil {
		log.Error().Err(err).Msg("egressd failed to start: cannot find its own binary to run the worker")
		return exitRuntime
	}
	// Nothing of the config is used from here on: hand its memory back, for the
	// parent's part is to stay small.
	debug.FreeOSMemory()
	return supervise.Run(supervise.Options{
		Exe: exe, Args: os.Args[1:], Files: files, SocketsEnv: env, Signals: sigs, Log: log,
		Notify: func(state string) { sd.SdNotify(false, state) },
	})
}

// parentSockets opens the sockets of l, taking those systemd passed, and
// returns them as files for the workers, with the variable that names them.
func parentSockets(cfgPath string, l *daemon.Loaded, log zerolog.Logger) ([]*os.File, string, error) {
	held, err := sockets.Activated()
	if err != nil {
		return nil, "", err
	}
	set, _, err := daemon.OpenSockets(cfgPath, l, held)
	for _, s := range held.Rest() {
		log.Warn().Str("socket", s.Spec.String()).Msg("a socket from systemd that no listener of the config names: closed")
		s.Close()
	}
	if err != nil {
		return nil, "", err
	}
	defer set.Close() // the files keep the sockets open
	return set.Handover()
}
