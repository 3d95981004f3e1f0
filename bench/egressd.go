package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Bounds on egressd's lifecycle, so a broken build cannot hang the bench.
const (
	// startTimeout bounds the wait for both listeners and /healthz.
	startTimeout = 10 * time.Second
	// stopTimeout bounds the wait after SIGTERM before SIGKILL. Every client
	// connection is closed by then, so egressd's drain has nothing to wait for.
	stopTimeout = 10 * time.Second
	// logSettle bounds the wait for egressd to finish writing the lines of a
	// run (tunnels log when they close, just after the run ends).
	logSettle = 3 * time.Second
	// maxExamples is how many raw unexpected log lines a report keeps per path.
	maxExamples = 5
)

// egressd is the subprocess under test, with the config and log it runs with.
type egressd struct {
	cmd       *exec.Cmd
	dir       string
	logPath   string // egressd's stdout: its JSON log, one line per request
	errPath   string // its stderr: load errors before the logger exists
	proxyURL  string // http://127.0.0.1:port of the bench listener
	adminAddr string

	exited   chan struct{} // closed when the process has been reaped
	exitErr  error         // valid once exited is closed
	stopOnce sync.Once
	stopMsg  string
}

// startEgressd writes the config into dir, starts egressd on it and returns once
// /healthz answers. Listeners bind port 0; their addresses come from the
// "listening" log lines, so no port is ever guessed.
func startEgressd(ctx context.Context, bin, dir string, up *upstream) (*egressd, error) {
	cfgPath, err := writeConfig(dir, up)
	if err != nil {
		return nil, err
	}
	e := &egressd{
		dir:     dir,
		logPath: filepath.Join(dir, "egressd.log"),
		errPath: filepath.Join(dir, "egressd.stderr"),
		exited:  make(chan struct{}),
	}
	if err := e.spawn(bin, cfgPath); err != nil {
		return nil, err
	}
	if err := e.waitReady(ctx); err != nil {
		e.stop()
		return nil, fmt.Errorf("%w%s", err, e.stderrTail())
	}
	return e, nil
}

func (e *egressd) spawn(bin, cfgPath string) error {
	stdout, err := os.Create(e.logPath)
	if err != nil {
		return err
	}
	defer stdout.Close()
	stderr, err := os.Create(e.errPath)
	if err != nil {
		return err
	}
	defer stderr.Close()
	e.cmd = exec.Command(bin, "run", "--config", cfgPath)
	e.cmd.Dir = e.dir
	e.cmd.Stdout, e.cmd.Stderr = stdout, stderr
	// Own process group: Ctrl-C reaches the bench, which stops egressd with
	// SIGTERM itself. Pdeathsig stops it if the bench dies without cleaning up.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := e.cmd.Start(); err != nil {
		return err
	}
	go func() {
		e.exitErr = e.cmd.Wait()
		close(e.exited)
	}()
	return nil
}

// waitReady waits for the bench and admin listeners to be bound and for
// /healthz to answer 200.
func (e *egressd) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for e.proxyURL == "" || e.adminAddr == "" {
		if err := e.pause(ctx, "listening"); err != nil {
			return err
		}
		addrs, err := listening(e.logPath)
		if err != nil {
			return err
		}
		if a := addrs["bench"]; a != "" {
			e.proxyURL = "http://" + a
		}
		e.adminAddr = addrs["admin"]
	}
	hc := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	for {
		resp, err := hc.Get("http://" + e.adminAddr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := e.pause(ctx, "/healthz"); err != nil {
			return err
		}
	}
}

// pause sleeps a little, failing if egressd has exited or the wait is over.
func (e *egressd) pause(ctx context.Context, waitingFor string) error {
	select {
	case <-e.exited:
		return fmt.Errorf("exited while waiting for %s: %v", waitingFor, e.exitErr)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", waitingFor, ctx.Err())
	case <-time.After(20 * time.Millisecond):
		return nil
	}
}

// listening reads the "listening" lines egressd logs at start: listener name
// to bound address.
func listening(logPath string) (map[string]string, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return nil, err
	}
	addrs := map[string]string{}
	for line := range bytes.Lines(data) {
		var l struct{ Message, Listener, Address string }
		if json.Unmarshal(line, &l) == nil && l.Message == "listening" {
			addrs[l.Listener] = l.Address
		}
	}
	return addrs, nil
}

// stop sends SIGTERM, waits up to stopTimeout, then kills. It runs once and
// returns "" when egressd exited 0, otherwise how it ended.
func (e *egressd) stop() string {
	e.stopOnce.Do(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
			if e.exitErr != nil {
				e.stopMsg = "after SIGTERM: " + e.exitErr.Error()
			}
		case <-time.After(stopTimeout):
			_ = e.cmd.Process.Kill()
			<-e.exited
			e.stopMsg = fmt.Sprintf("still running %s after SIGTERM; killed", stopTimeout)
		}
	})
	return e.stopMsg
}

func (e *egressd) stderrTail() string {
	b, _ := os.ReadFile(e.errPath)
	if log, _ := os.ReadFile(e.logPath); len(log) > 0 {
		b = append(b, log...)
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return ""
	}
	return "; egressd said:\n" + string(b)
}

func (e *egressd) cpuTime() (time.Duration, error) { return procCPU(e.cmd.Process.Pid) }

// peakRSS is VmHWM, the resident set's high-water mark over the whole run.
func (e *egressd) peakRSS() (int64, string) {
	n, err := procPeakRSS(e.cmd.Process.Pid)
	if err != nil {
		return 0, err.Error()
	}
	return n, ""
}

func (e *egressd) logSize() int64 {
	fi, err := os.Stat(e.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSummary is what egressd logged during one run through it: the canonical
// line count, and every line that was not a plain success, grouped.
type logSummary struct {
	Lines       int64            `json:"lines"`
	EgressLines int64            `json:"egress_lines"` // one per request or tunnel
	Allowed200  int64            `json:"allowed_200"`  // egress lines: decision allow, status 200, no error
	Unexpected  map[string]int64 `json:"unexpected,omitempty"`
	Examples    []string         `json:"examples,omitempty"` // raw lines, the first few
}

// scanLog summarises the log from offset from, once egressd has stopped
// writing (tunnels log at close, which is just after a run ends).
func (e *egressd) scanLog(from int64) (logSummary, error) {
	e.settleLog()
	var s logSummary
	f, err := os.Open(e.logPath)
	if err != nil {
		return s, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return s, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		s.add(sc.Bytes())
	}
	return s, sc.Err()
}

// settleLog waits, up to logSettle, for the log to stop growing.
func (e *egressd) settleLog() {
	deadline := time.Now().Add(logSettle)
	last, stable := e.logSize(), 0
	for stable < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n := e.logSize()
		if n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
}

var (
	egressMsg = []byte(`"message":"egress"`)
	allowed   = []byte(`"decision":"allow"`)
	status200 = []byte(`"status":200,`)
	noError   = []byte(`"error":""`)
)

func (s *logSummary) add(line []byte) {
	s.Lines++
	isEgress := bytes.Contains(line, egressMsg)
	if isEgress {
		s.EgressLines++
		// The fast path: most lines are successes and are not decoded.
		if bytes.Contains(line, allowed) && bytes.Contains(line, status200) && bytes.Contains(line, noError) {
			s.Allowed200++
			return
		}
	}
	key, ok := unexpectedKey(line, isEgress)
	if !ok {
		return
	}
	if s.Unexpected == nil {
		s.Unexpected = map[string]int64{}
	}
	s.Unexpected[key]++
	if len(s.Examples) < maxExamples {
		s.Examples = append(s.Examples, truncate(string(line), 600))
	}
}

// unexpectedKey groups an egress line that is not a plain success, or a
// warn/error line; other lines (info, debug) are not unexpected.
func unexpectedKey(line []byte, isEgress bool) (string, bool) {
	var l struct {
		Level, Message, Method, Scheme, Decision, Reason, Detail, Error string
		Status                                                          int
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return "unparsed line: " + truncate(string(line), 120), true
	}
	if isEgress {
		k := fmt.Sprintf("%s %s: decision=%s status=%d", l.Method, l.Scheme, l.Decision, l.Status)
		if l.Reason != "" {
			k += " reason=" + l.Reason
		}
		if l.Detail != "" {
			k += " detail=" + l.Detail
		}
		if l.Error != "" {
			k += " error=" + normalizeErr(l.Error)
		}
		return k, true
	}
	if l.Level == "warn" || l.Level == "error" || l.Level == "fatal" || l.Level == "panic" {
		return l.Level + ": " + l.Message + errSuffix(l.Error), true
	}
	return "", false
}

func errSuffix(err string) string {
	if err == "" {
		return ""
	}
	return ": " + normalizeErr(err)
}

// ephemeral matches loopback addresses with a port, which differ on every
// connection and would split one kind of error into thousands of groups.
var ephemeral = regexp.MustCompile(`127\.\d+\.\d+\.\d+:\d+`)

func normalizeErr(s string) string {
	return ephemeral.ReplaceAllString(s, "127.x:port")
}

func truncate(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// writeConfig writes egressd.yaml (and the files it names) into dir and
// returns its path. Every address it names is on 127.0.0.0/8.
func writeConfig(dir string, up *upstream) (string, error) {
	caPath := filepath.Join(dir, "bench-ca.pem")
	if err := os.WriteFile(caPath, up.caPEM, 0o600); err != nil {
		return "", err
	}
	// credentials.file is required with the file backend; the bench injects
	// nothing, so the file is an empty object.
	if err := os.WriteFile(filepath.Join(dir, "credentials.json"), []byte("{}\n"), 0o600); err != nil {
		return "", err
	}
	ports, err := upstreamPorts(up)
	if err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(configTemplate, ports, ports, strconv.Quote(caPath))
	path := filepath.Join(dir, "egressd.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

func upstreamPorts(up *upstream) (string, error) {
	var ports []string
	for _, a := range []string{up.httpAddr, up.tlsAddr} {
		i := strings.LastIndexByte(a, ':')
		if i < 0 {
			return "", errors.New("upstream address without a port: " + a)
		}
		ports = append(ports, a[i+1:])
	}
	return "[" + strings.Join(ports, ", ") + "]", nil
}

// configTemplate is egressd's config for a bench run: its full request path
// (allowlist, address guard, one JSON log line per request at info) with
// loopback opened, since the upstream lives there. Listeners bind port 0.
const configTemplate = `# Generated by egressd's bench for one run; removed with its temp dir.
version: 1
environment: env_bench
listeners:
  - name: bench
    address: 127.0.0.1:0
    mode: proxy
    role: sandbox
admin:
  address: 127.0.0.1:0
policy:
  allowlist:
    - domain: localhost
      ports: %s
    - domain: bench.test
      ports: %s
network:
  unsafe_allow_cidrs: [127.0.0.0/8]   # the upstream is on loopback; development and tests only
tls:
  upstream_ca_file: %s
credentials:
  backend: file
  file: credentials.json
log:
  level: info                         # the canonical line per request is part of the cost
  format: json
state_dir: state
`
