package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/load"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

const (
	// logSettle bounds the wait for the lines of a run: tunnels log when they
	// close, just after the run ends.
	logSettle   = 3 * time.Second
	maxExamples = 5 // raw unexpected log lines kept per path
)

// egressd is an egressd subprocess (internal/testutil/egressdtest) with what
// the bench reads of it: CPU, RSS, metrics and the log of a run.
type egressd struct {
	*egressdtest.Egressd
	proxyURL string // http://127.0.0.1:port of the bench listener
}

// startEgressd writes cfg and files into dir, starts egressd on them and
// returns once /healthz answers.
func startEgressd(ctx context.Context, bin, dir string, cfg *egressdtest.Config, files map[string]string) (*egressd, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	listener, proxy := benchListener, loopbackOnly
	if cfg.Node != nil { // a node's sandboxes are served on listeners of their own
		listener, proxy = "node_api", func(string) error { return nil }
	}
	e, err := egressdtest.Start(ctx, egressdtest.Options{Bin: bin, Dir: dir, Config: cfg, Files: files,
		ProxyListener: listener, Wait: egressdtest.WaitHealthy})
	if err != nil {
		return nil, err
	}
	if err := errors.Join(proxy(e.Proxy), loopbackOnly(e.Admin)); err != nil {
		e.Kill()
		return nil, err
	}
	return &egressd{Egressd: e, proxyURL: "http://" + e.Proxy}, nil
}

// stop sends SIGTERM and returns "" when egressd exited 0, otherwise how it ended.
func (e *egressd) stop() string {
	code, err := e.Stop()
	switch {
	case err != nil:
		return err.Error()
	case code != 0:
		return fmt.Sprintf("after SIGTERM: exit code %d", code)
	}
	return ""
}

// cpuTime is egressd's CPU time so far (user + system).
func (e *egressd) cpuTime() (time.Duration, error) { return procfs.CPU(e.ServingPid()) }

// peakRSS is VmHWM, the resident set's high-water mark so far (0 when unreadable).
func (e *egressd) peakRSS() int64 {
	n, _ := procfs.PeakRSS(e.ServingPid())
	return n
}

// metric is one series from /metrics, 0 when egressd does not export it.
func (e *egressd) metric(series string) (int64, error) {
	v, _, err := e.Metric(series)
	return int64(v), err
}

// leafCounts is egressd_leaf_cache_total by result.
type leafCounts struct {
	Hit  int64 `json:"hit"`
	Miss int64 `json:"miss"`
}

// leafCache scrapes egressd_leaf_cache_total from /metrics.
func (e *egressd) leafCache() (leafCounts, error) {
	m, err := e.Metrics()
	hit, okHit := m[`egressd_leaf_cache_total{result="hit"}`]
	miss, okMiss := m[`egressd_leaf_cache_total{result="miss"}`]
	if err == nil && !okHit && !okMiss {
		err = errors.New("no egressd_leaf_cache_total in /metrics")
	}
	return leafCounts{Hit: int64(hit), Miss: int64(miss)}, err
}

// logSummary is what egressd logged during one run through it: the canonical
// line count, and every line that was not a plain success, grouped.
type logSummary struct {
	Lines       int64            `json:"lines"`
	EgressLines int64            `json:"egress_lines"` // one per request or tunnel
	Allowed200  int64            `json:"allowed_200"`  // egress lines: decision allow, status 200, no error
	Scrubbed    int64            `json:"scrubbed"`     // egress lines whose response egressd scrubbed (scrubbed > 0)
	Unexpected  map[string]int64 `json:"unexpected,omitempty"`
	Examples    []string         `json:"examples,omitempty"` // raw lines, the first few
}

// merge adds o, a later run's summary, to s.
func (s *logSummary) merge(o logSummary) {
	s.Lines += o.Lines
	s.EgressLines += o.EgressLines
	s.Allowed200 += o.Allowed200
	s.Scrubbed += o.Scrubbed
	addCounts(&s.Unexpected, o.Unexpected)
	s.Examples = append(s.Examples, o.Examples...)
	s.Examples = s.Examples[:min(len(s.Examples), maxExamples)]
}

// scanLog summarises the log from offset from, once egressd has stopped
// writing (tunnels log at close, which is just after a run ends).
func (e *egressd) scanLog(from int64) (logSummary, error) {
	e.settleLog()
	var s logSummary
	b, err := e.Cursor(from).Raw()
	for line := range bytes.Lines(b) {
		s.add(line)
	}
	return s, err
}

// settleLog waits, up to logSettle, for the log to stop growing.
func (e *egressd) settleLog() {
	deadline := time.Now().Add(logSettle)
	last, stable := e.LogSize(), 0
	for stable < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n := e.LogSize()
		if n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
}

var (
	egressMsg = []byte(`"message":"egress"`)
	scrubbed  = []byte(`"scrubbed":`)
	unmasked  = []byte(`"scrubbed":0,`)
	allowed   = []byte(`"decision":"allow"`)
	status200 = []byte(`"status":200,`)
	status0   = []byte(`"status":0,`)
	tlsScheme = []byte(`"scheme":"tls"`)
	noError   = []byte(`"error":""`)
)

func (s *logSummary) add(line []byte) {
	s.Lines++
	isEgress := bytes.Contains(line, egressMsg)
	if isEgress {
		s.EgressLines++
		if bytes.Contains(line, scrubbed) && !bytes.Contains(line, unmasked) {
			s.Scrubbed++
		}
		// The fast path: most lines are successes and are not decoded. A
		// transparent listener's spliced TLS has no HTTP status.
		ok := bytes.Contains(line, status200) || bytes.Contains(line, tlsScheme) && bytes.Contains(line, status0)
		if ok && bytes.Contains(line, allowed) && bytes.Contains(line, noError) {
			s.Allowed200++
			return
		}
	}
	key, ok := unexpectedKey(line, isEgress)
	if !ok {
		return
	}
	addCount(&s.Unexpected, key, 1)
	if len(s.Examples) < maxExamples {
		s.Examples = append(s.Examples, truncate(string(line), 600))
	}
}

// addCounts adds every count of src to *dst, making it when needed.
func addCounts(dst *map[string]int64, src map[string]int64) {
	for k, n := range src {
		addCount(dst, k, n)
	}
}

// addCount adds n to (*dst)[k], making *dst when needed.
func addCount(dst *map[string]int64, k string, n int64) {
	if *dst == nil {
		*dst = map[string]int64{}
	}
	(*dst)[k] += n
}

// reflectedWarn begins the WARN egressd logs the first time an upstream
// reflects an injected value, which the credential paths' upstream does on purpose.
const reflectedWarn = "an upstream reflected a value egressd injected"

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
		for _, f := range [][2]string{{"reason", l.Reason}, {"detail", l.Detail}, {"error", load.ErrorKind(l.Error)}} {
			if f[1] != "" {
				k += " " + f[0] + "=" + f[1]
			}
		}
		return k, true
	}
	if l.Level == "warn" && !strings.HasPrefix(l.Message, reflectedWarn) || slices.Contains([]string{"error", "fatal", "panic"}, l.Level) {
		if l.Error != "" {
			l.Message += ": " + load.ErrorKind(l.Error)
		}
		return l.Level + ": " + l.Message, true
	}
	return "", false
}

func truncate(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
