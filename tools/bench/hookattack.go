package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/testutil/hookflood"
)

// The "hook under attack" row: the runtime's pre-tool calls, one after another
// on new connections, through an egressd of its own whose every connection
// slot is held by a spliced tunnel while the sandbox floods it with fake calls
// (internal/testutil/hookflood, in a child process: CONNECT, TLS, a POST whose
// body never ends). hooks.identify url makes the fakes contest the hook lane
// with the real calls. The runtime reads a call that fails in transport as
// allow, so every real call must get an answer, allow or deny. Direct columns:
// the same calls before the flood.
const (
	hookAttackRow        = "hook-attack"
	attackMaxConnections = 64 // every one held by a spliced tunnel
	floodRate            = 1000
	// The measured calls run in the flood's middle, floodSettle from either end.
	floodFor    = 6 * time.Second
	floodSettle = time.Second
	floodHold   = 3 * time.Second // a fake connection's longest life
	floodOpen   = 8000            // fake connections open at once, at most
	// callGap spaces the real calls, as tool calls are.
	callGap    = 50 * time.Millisecond
	callWithin = (hookTimeout + 5) * time.Second
)

// attackSummary is what the hook-attack row's attack did, and what the real
// calls got.
type attackSummary struct {
	MaxConnections int   `json:"max_connections"`
	Held           int64 `json:"held"` // spliced tunnels holding the listener's slots
	// ProbeStatus is an ordinary GET's during the flood: 503 when the
	// listener is full.
	ProbeStatus int             `json:"probe_status"`
	ProbeReason string          `json:"probe_reason,omitempty"`
	Flood       hookflood.Stats `json:"flood"`
	// Outcomes counts the real calls under the flood by what they got;
	// NotAnswered those that got neither allow nor deny.
	Outcomes    map[string]int64 `json:"outcomes"`
	NotAnswered int64            `json:"not_answered"`
	Refused     map[string]int64 `json:"refused,omitempty"` // the fake calls' log lines
}

// attackLine tells the log keys of the fake calls' own ends: they are the
// attack, not unexpected.
var attackLine = regexp.MustCompile(`reason=overloaded|detail=body_timeout|detail=malformed_body|detail=client_tls|detail=client_untrusted_ca|detail=not_tls|reason=client_cancelled`)

// measureHookUnderAttack measures the real calls idle, then under the flood.
func measureHookUnderAttack(ctx context.Context, env pathEnv) (pathResult, error) {
	ae, caller, err := startAttackEgressd(ctx, env)
	if err != nil {
		return pathResult{}, fmt.Errorf("%s: %w", hookAttackRow, err)
	}
	defer ae.stop()
	sum := &attackSummary{MaxConnections: attackMaxConnections}
	held := holdTunnels(ctx, caller.Proxy, env.w.up, env.o.size, attackMaxConnections)
	defer func() {
		for _, tr := range held {
			tr.CloseIdleConnections()
		}
	}()
	sum.Held = int64(len(held))
	idle, _ := realCalls(ctx, env.w.up.hook, caller, floodFor-2*floodSettle, nil)
	fl, err := hookflood.Start("", hookflood.Options{Proxy: caller.Proxy, Host: hookHost, Port: caller.Port, Path: hookURLPath,
		Rate: floodRate, For: floodFor, Hold: floodHold, MaxOpen: floodOpen})
	if err != nil {
		return pathResult{}, err
	}
	defer fl.Stop()
	time.Sleep(floodSettle)
	sum.ProbeStatus, sum.ProbeReason = probeOrdinary(caller.Proxy, localhostAddr(env.w.up.httpAddr))
	x, err := measureVia(ae, env.dns, func(cpu cpuFunc) (r runResult, err error) {
		r, sum.Outcomes = realCalls(ctx, env.w.up.hook, caller, floodFor-2*floodSettle-time.Second, cpu)
		return r, nil
	})
	if err == nil {
		sum.Flood, err = fl.Wait()
	}
	if err != nil {
		return pathResult{}, err
	}
	sum.NotAnswered = x.r.Errors
	return sum.row(idle, x, ae), nil
}

// takeAttackLines moves the fake calls' log lines to the summary.
func (s *attackSummary) takeAttackLines(log *logSummary) {
	for k, n := range log.Unexpected {
		if attackLine.MatchString(k) {
			addCount(&s.Refused, k, n)
			delete(log.Unexpected, k)
		}
	}
	if len(log.Unexpected) == 0 {
		log.Unexpected, log.Examples = nil, nil
	}
}

// row is the hook-attack row.
func (s *attackSummary) row(idle runResult, x viaRun, ae *egressd) pathResult {
	rb := newRow(hookAttackRow, fmt.Sprintf(
		"pre-tool calls to the hook URL, one at a time, each on a new connection (CONNECT, TLS, POST), through an egressd with limits.max_connections %d held by spliced tunnels and hooks.identify url, "+
			"while %d fake calls a second flood it (CONNECT, TLS, a POST whose body never ends); direct columns: the same calls before the flood",
		attackMaxConnections, floodRate), "as the hook row")
	rb.res.NewConnPerRequest, rb.e = true, ae
	rb.add(idle, x)
	res := rb.finish()
	s.takeAttackLines(&res.Log)
	res.Attack = s
	res.Problems = append(res.Problems, s.problems()...)
	return res
}

// realCalls makes the runtime's calls one after another, callGap apart, for d,
// and returns them as a run (a call that got no answer is an error, counted by
// what went wrong; hs's counts filled in) with the calls counted by outcome.
// cpu, when set, is egressd's CPU time, sampled over the run.
func realCalls(ctx context.Context, hs *hookServer, c hookflood.Caller, d time.Duration, cpu cpuFunc) (runResult, map[string]int64) {
	var r runResult
	before := hs.counts()
	outcomes := map[string]int64{}
	var cpu0 time.Duration
	if cpu != nil {
		cpu0, _ = cpu()
	}
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		o, took := c.Call(callWithin)
		outcomes[o]++
		r.Total++
		if o != hookflood.Allow && o != hookflood.Deny {
			r.Errors++
			addCount(&r.ErrorKinds, o, 1)
			continue
		}
		r.hist.Record(took)
		time.Sleep(callGap)
	}
	seconds := time.Since(start).Seconds()
	if cpu != nil {
		if cpu1, err := cpu(); err == nil {
			r.CPUSeconds = (cpu1 - cpu0).Seconds()
		} else {
			r.CPUError = err.Error()
		}
	}
	r.ClientConns = r.Total
	r.window(seconds)
	r.fill(hs.counts().sub(before))
	return r, outcomes
}

// problems says when the row did not measure what it claims: the listener
// was not full, the flood fell short, or a real call got no answer.
func (s *attackSummary) problems() []string {
	var out []string
	if s.ProbeStatus != http.StatusServiceUnavailable {
		out = append(out, fmt.Sprintf("an ordinary request during the flood got %d, not 503 overloaded: the listener was not full", s.ProbeStatus))
	}
	if s.Held < int64(s.MaxConnections) {
		out = append(out, fmt.Sprintf("%d spliced tunnels held the listener, fewer than limits.max_connections %d", s.Held, s.MaxConnections))
	}
	if rate := s.Flood.Rate(); rate < 0.95*floodRate {
		out = append(out, fmt.Sprintf("the flood began %.0f fake calls a second, not %d", rate, floodRate))
	}
	if s.NotAnswered > 0 {
		out = append(out, fmt.Sprintf("%d real calls got no answer (the runtime reads that as allow): %v", s.NotAnswered, s.Outcomes))
	}
	return out
}

// startAttackEgressd starts the row's egressd (benchConfig's but for
// limits.max_connections and hooks.identify url) and points the hook
// endpoint's verifier at its signing key.
func startAttackEgressd(ctx context.Context, env pathEnv) (*egressd, hookflood.Caller, error) {
	cfg, files := benchConfig(env.w.up, env.dns.Addr, nil, attackMaxConnections)
	cfg.Hooks.Identify = "url"
	ae, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, hookAttackRow), cfg, files)
	if err != nil {
		return nil, hookflood.Caller{}, fmt.Errorf("egressd: %w", err)
	}
	hs := env.w.up.hook
	c := hookflood.Caller{Proxy: ae.Proxy, Host: hookHost, Port: portNum(hs.addr), Path: hookURLPath, Body: hookRequestBody()}
	c.Roots, err = ae.CAPool()
	if err == nil {
		err = hs.trust(ae)
	}
	if err != nil {
		ae.stop()
	}
	return ae, c, err
}

// holdTunnels opens up to n CONNECT tunnels through the proxy at proxyAddr to
// the upstream's TLS port, each with a TLS handshake and one GET through it
// (the upstream closes a TLS connection that sent no request, never an idle
// keep-alive one), and leaves them open, each a transport holding its one
// connection; it stops at the first that fails, which the row reports as
// fewer held.
func holdTunnels(ctx context.Context, proxyAddr string, up *upstream, size, n int) []*http.Transport {
	t := target{url: "https://" + localhostAddr(up.tlsAddr) + "/", proxy: "http://" + proxyAddr, roots: up.roots, check: expectSize(size)}
	var held []*http.Transport
	for range n {
		c, err := newClient(ctx, t, new(atomic.Int64))
		if err == nil {
			err = c.roundTrip()
		}
		if err != nil {
			break
		}
		held = append(held, c.tr)
	}
	return held
}

// probeOrdinary sends one ordinary GET (no hook call) through egressd at
// proxyAddr and returns its status and Egressd-Reason.
func probeOrdinary(proxyAddr, authority string) (int, string) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr})}}
	resp, err := c.Get("http://" + authority + "/")
	if err != nil {
		return 0, err.Error()
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Egressd-Reason")
}

// writeAttackNote prints the hook-attack row: the real calls under the flood
// beside the same calls idle, and how many got no answer.
func (r *report) writeAttackNote(w io.Writer) {
	a := r.path(hookAttackRow)
	if a == nil || a.Attack == nil {
		return
	}
	at := a.Attack
	fmt.Fprintf(w, "hook under attack (%.0f fake calls/s begun, %.0f/s reached their POST, %d open at most; max_connections %d held by %d spliced tunnels; an ordinary request got %d %s; egressd %.2f CPU-s/s): "+
		"real calls p50 %s, p99 %s, vs %s and %s idle; %d calls %v; got anything but an answer: %d\n",
		at.Flood.Rate(), at.Flood.PostRate(), at.Flood.PeakOpen, at.MaxConnections, at.Held, at.ProbeStatus, at.ProbeReason,
		a.Egressd.CPUSeconds/max(a.Egressd.Seconds, 1e-9),
		dur(a.Egressd.P50US), dur(a.Egressd.P99US), dur(a.Direct.P50US), dur(a.Direct.P99US),
		a.Egressd.Total, at.Outcomes, at.NotAnswered)
}
