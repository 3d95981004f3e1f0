package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/egressd/egressd/internal/daemon"
	"github.com/egressd/egressd/internal/metrics"
)

func cmdRun(args []string) int {
	fs, cfgPath, _ := newFlags("run", stderr)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	l, err := daemon.Load(*cfgPath)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	log := newLogger(l.Cfg.Log)
	// Take the signals before anything starts, so a SIGTERM or SIGHUP that arrives
	// during start-up is handled rather than killing the process.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	d := daemon.New(*cfgPath, log, metrics.New())
	if err := d.Start(l); err != nil {
		log.Error().Err(err).Msg("egressd failed to start")
		return exitRuntime
	}
	if err := d.Run(ctx, hup); err != nil {
		return exitRuntime
	}
	return exitOK
}
