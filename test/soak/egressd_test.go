package soak_test

import (
	"context"
	"net/http"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// Bounds on egressd's lifecycle.
const (
	startTimeout = 20 * time.Second // "egressd started", /healthz and /readyz 200
	stopTimeout  = 15 * time.Second // SIGTERM to exit; then SIGKILL
)

// egressd is the running binary under soak (internal/testutil/egressdtest).
type egressd struct {
	*egressdtest.Egressd
}

// startEgressd starts `egressd run` on f's config, in this loopback-only
// namespace only, and waits until it serves: its log says "egressd started",
// /healthz answers and /readyz says ready (the credential backend has answered).
func startEgressd(bin string, f *files) (*egressd, error) {
	e, err := egressdtest.Start(context.Background(), egressdtest.Options{
		Bin: bin, Dir: f.dir, ConfigPath: f.config, LoopbackOnly: true, Wait: egressdtest.WaitReady,
		StartTimeout: startTimeout, StopTimeout: stopTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &egressd{e}, nil
}

// The series the soak reads.
const (
	seriesGoroutines = "go_goroutines"
	seriesTunnels    = "egressd_tunnels_active"
	seriesReloadOK   = `egressd_config_reloads_total{result="ok"}`
	seriesReloadErr  = `egressd_config_reloads_total{result="error"}`
)

// configHash is /healthz's config_hash: the config in force.
func (e *egressd) configHash() (string, error) {
	h, err := e.Healthz()
	return h.ConfigHash, err
}

// hasAdminReload reports whether the admin listener serves POST /v1/reload, asked
// without reloading: a GET of a POST-only route is 405, of no route 404.
func (e *egressd) hasAdminReload() (bool, error) {
	code, _, err := e.AdminGet("/v1/reload")
	return code == http.StatusMethodNotAllowed, err
}

// adminReload is POST /v1/reload: its status and body.
func (e *egressd) adminReload() (int, []byte, error) { return e.AdminPost("/v1/reload") }

func (e *egressd) signal(sig syscall.Signal) error { return e.Signal(sig) }
