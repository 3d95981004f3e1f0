package soak_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bounds on egressd's lifecycle and on every request to its admin listener.
const (
	startTimeout = 20 * time.Second // "egressd started", /healthz and /readyz 200
	stopTimeout  = 15 * time.Second // SIGTERM to exit; then SIGKILL
	adminTimeout = 5 * time.Second
	// signalGrace: egressd installs its signal handlers only after it logs "egressd
	// started" (cmd/egressd TestRunSignalRightAfterStart); the soak waits this long
	// after that line before it relies on them.
	signalGrace = 500 * time.Millisecond
)

// egressd is the running binary under soak.
type egressd struct {
	f        *files
	cmd      *exec.Cmd
	admin    string // 127.0.0.1:port
	proxy    string // 127.0.0.1:port
	hc       *http.Client
	exited   chan struct{}
	exitCode int // valid once exited is closed; -1 when killed by a signal
}

// startEgressd starts `egressd run` on f's config and waits until it serves: its
// log says "egressd started", /healthz answers and /readyz says ready (the
// credential backend has answered).
func startEgressd(bin string, f *files) (*egressd, error) {
	stdout, err := os.Create(f.log)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(f.stderr)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	e := &egressd{
		f: f, admin: fmt.Sprintf("127.0.0.1:%d", f.adminPort), proxy: fmt.Sprintf("127.0.0.1:%d", f.proxyPort),
		hc:     &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: adminTimeout},
		exited: make(chan struct{}),
	}
	e.cmd = exec.Command(bin, "run", "--config", f.config)
	e.cmd.Dir = f.dir
	e.cmd.Stdout, e.cmd.Stderr = stdout, stderr
	// Own process group, and SIGKILL if the test binary dies: egressd never outlives the soak.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		err := e.cmd.Wait()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exit):
			e.exitCode = exit.ExitCode()
		default:
			e.exitCode = -2
		}
		close(e.exited)
	}()
	if err := e.waitReady(); err != nil {
		e.kill()
		return nil, fmt.Errorf("%w%s", err, e.outputTail())
	}
	return e, nil
}

func (e *egressd) pid() int { return e.cmd.Process.Pid }

func (e *egressd) waitReady() error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for step := 0; ; step++ {
		select {
		case <-e.exited:
			return fmt.Errorf("egressd exited (%d) while starting", e.exitCode)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("egressd not ready within %v: %v", startTimeout, last)
		}
		last = e.ready()
		if last == nil {
			time.Sleep(signalGrace)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *egressd) ready() error {
	log, err := os.ReadFile(e.f.log)
	if err != nil {
		return err
	}
	if !bytes.Contains(log, []byte(`"message":"egressd started"`)) {
		return errors.New(`no "egressd started" line yet`)
	}
	if _, err := e.adminGet("/healthz"); err != nil {
		return err
	}
	b, err := e.adminGet("/readyz")
	if err != nil {
		return err
	}
	var r struct {
		Ready bool `json:"ready"`
	}
	if err := json.Unmarshal(b, &r); err != nil || !r.Ready {
		return fmt.Errorf("/readyz: %s", b)
	}
	return nil
}

// adminGet fetches path from the admin listener; anything but 200 is an error.
func (e *egressd) adminGet(path string) ([]byte, error) {
	resp, err := e.hc.Get("http://" + e.admin + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(b))
	}
	return b, nil
}

// metrics scrapes /metrics into series -> value, the series written as Prometheus
// writes them (labels in name order).
func (e *egressd) metrics() (map[string]float64, error) {
	b, err := e.adminGet("/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
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
	b, err := e.adminGet("/healthz")
	if err != nil {
		return "", err
	}
	var h struct {
		ConfigHash string `json:"config_hash"`
	}
	if err := json.Unmarshal(b, &h); err != nil || h.ConfigHash == "" {
		return "", fmt.Errorf("/healthz without a config_hash: %s", b)
	}
	return h.ConfigHash, nil
}

// hasAdminReload reports whether the admin listener serves POST /v1/reload, asked
// without reloading: a GET of a POST-only route is 405, of no route 404.
func (e *egressd) hasAdminReload() (bool, error) {
	resp, err := e.hc.Get("http://" + e.admin + "/v1/reload")
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusMethodNotAllowed, nil
}

// adminReload is POST /v1/reload: its status and body.
func (e *egressd) adminReload() (int, []byte, error) {
	hc := &http.Client{Transport: e.hc.Transport, Timeout: reloadTimeout}
	resp, err := hc.Post("http://"+e.admin+"/v1/reload", "application/json", nil)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

func (e *egressd) signal(sig syscall.Signal) error { return e.cmd.Process.Signal(sig) }

// stop sends SIGTERM and waits for the exit; after stopTimeout it kills. It returns
// the exit code, or an error when egressd had to be killed.
func (e *egressd) stop() (int, error) {
	select {
	case <-e.exited:
		return e.exitCode, fmt.Errorf("egressd had exited (%d) before SIGTERM", e.exitCode)
	default:
	}
	_ = e.signal(syscall.SIGTERM)
	select {
	case <-e.exited:
		return e.exitCode, nil
	case <-time.After(stopTimeout):
		e.kill()
		return e.exitCode, fmt.Errorf("egressd still running %v after SIGTERM; killed", stopTimeout)
	}
}

// kill kills egressd's process group and waits for the exit.
func (e *egressd) kill() {
	select {
	case <-e.exited:
		return
	default:
	}
	_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
	<-e.exited
}

func (e *egressd) alive() bool {
	select {
	case <-e.exited:
		return false
	default:
		return true
	}
}

// outputTail is the end of egressd's stderr and log, for a start-up failure.
func (e *egressd) outputTail() string {
	b, _ := os.ReadFile(e.f.stderr)
	if log, _ := os.ReadFile(e.f.log); len(log) > 0 {
		b = append(b, log...)
	}
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; egressd said:\n" + string(b)
}
