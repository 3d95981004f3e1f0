package main

import (
	"net/netip"
	"os"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
	mitm "github.com/egressd/egressd/internal/tls"
)

// buildRuntime turns a loaded config into the Runtime requests are served with.
// self holds egressd's own bound addresses.
func buildRuntime(l *loaded, self []netip.AddrPort) (*proxy.Runtime, error) {
	cfg := l.cfg
	guard, err := netguard.New(netguard.Options{
		AllowCIDRs:       cfg.Network.AllowCIDRs,
		UnsafeAllowCIDRs: cfg.Network.UnsafeAllowCIDRs,
		Self:             self,
	})
	if err != nil {
		return nil, err
	}
	upstream, err := mitm.UpstreamConfig(cfg.TLS.UpstreamCAFile)
	if err != nil {
		return nil, err
	}
	rt := &proxy.Runtime{
		Env:         cfg.Environment,
		Policy:      l.policy.Allowlist,
		Guard:       guard,
		Resolver:    netguard.NewResolver(cfg.Network.Resolver, cfg.Limits.DNS),
		Limits:      cfg.Limits,
		UpstreamTLS: upstream,
	}
	rt.Prepare()
	return rt, nil
}

// newLogger builds the process logger from log.level and log.format.
func newLogger(c config.Log) zerolog.Logger {
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	var log zerolog.Logger
	if c.Format == "console" {
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr})
	} else {
		log = zerolog.New(os.Stdout)
	}
	return log.Level(level).With().Timestamp().Logger()
}
