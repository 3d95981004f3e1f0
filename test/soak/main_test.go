// Package soak_test is egressd's soak test: the real binary under minutes of mixed
// traffic (plain HTTP, spliced CONNECT, intercepted with a transform and with a
// file-backed credential, signed hook calls, denials of every kind), a reload every
// 30 s (valid and broken policy files, SIGHUP and POST /v1/reload) and a credential
// rotation every minute, with egressd's goroutines, open files and RSS sampled every
// 10 s. It fails on growth, on any request served with the wrong policy and on any
// unexpected error. README.md says what runs, what is checked and the thresholds.
//
// It is not part of `make test`: `make soak` runs it (SOAK_DURATION, default 10m).
// Without EGRESSD_SOAK=1 the package compiles, is vetted and linted with the rest,
// and TestSoak skips at once, so `go test ./...` stays fast.
//
// Invariant: nothing leaves the machine, even when egressd is wrong. With
// EGRESSD_SOAK=1 the package runs inside a loopback-only network namespace it makes
// itself (netns.Main); every address the load names is 127.0.0.1, or an internal
// address that egressd must refuse and that does not exist in the namespace.
package soak_test

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// The environment that drives the soak. make soak sets the first three.
const (
	// envSoak must be "1" for TestSoak to run; otherwise it skips.
	envSoak = "EGRESSD_SOAK"
	// envBinary names the egressd binary to soak (make soak: bin/egressd). When it is
	// unset, TestMain builds one into a temporary directory.
	envBinary = "EGRESSD_SOAK_BIN"
	// envDuration is the load's duration, a Go duration (default 10m, at most maxDuration).
	envDuration = "EGRESSD_SOAK_DURATION"
	// envClients is the number of concurrent clients (default 16).
	envClients = "EGRESSD_SOAK_CLIENTS"
	// envRate is the total request rate the clients aim at, per second (default 200).
	envRate = "EGRESSD_SOAK_RATE"
	// envKeep keeps the temporary directory (egressd's config, log, state) when "1".
	// It is kept anyway when the soak fails.
	envKeep = "EGRESSD_SOAK_KEEP"
)

// Defaults and bounds of the settings above.
const (
	defaultDuration = 10 * time.Minute
	minDuration     = 30 * time.Second
	maxDuration     = 2 * time.Hour
	defaultClients  = 16
	maxClients      = 256
	defaultRate     = 200
	maxRate         = 5000
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(envSoak) != "1" {
		os.Exit(m.Run()) // TestSoak skips; nothing is built and no namespace is made
	}
	// egressdtest builds egressd as make build does unless envBinary names one,
	// before the namespace is entered, where the Go toolchain may not reach the
	// module proxy.
	build := egressdtest.BuildOptions{Prebuilt: os.Getenv(envBinary), Static: true}
	os.Exit(egressdtest.Main(m, build, netns.Main))
}

// settings are the soak's knobs, read from the environment.
type settings struct {
	bin      string
	duration time.Duration
	clients  int
	rate     int // requests per second, all clients together
	keep     bool
}

func readSettings() (settings, error) {
	s := settings{
		bin: egressdtest.Binary(), duration: defaultDuration, clients: defaultClients, rate: defaultRate,
		keep: os.Getenv(envKeep) == "1",
	}
	if s.bin == "" {
		return s, fmt.Errorf("%s is not set (TestMain sets it)", egressdtest.EnvBinary)
	}
	if v := os.Getenv(envDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < minDuration || d > maxDuration {
			return s, fmt.Errorf("%s=%q: want a Go duration from %v to %v", envDuration, v, minDuration, maxDuration)
		}
		s.duration = d
	}
	var err error
	if s.clients, err = intSetting(envClients, defaultClients, 1, maxClients); err != nil {
		return s, err
	}
	if s.rate, err = intSetting(envRate, defaultRate, 1, maxRate); err != nil {
		return s, err
	}
	return s, nil
}

func intSetting(name string, def, lo, hi int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer from %d to %d", name, v, lo, hi)
	}
	return n, nil
}
