package soak_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

const (
	// setupSlack bounds everything but the load: start-up, the drain of the last
	// requests, the wait for tunnels to close, egressd's stop and the log scan.
	setupSlack = 3 * time.Minute
	// hardSlack is the watchdog's margin over the load's duration: past it the soak
	// kills egressd and panics with every goroutine's stack, whatever hangs.
	hardSlack = 5 * time.Minute
	// tunnelsDrain bounds the wait for egressd_tunnels_active to reach 0 once every
	// client has closed its connections.
	tunnelsDrain = 15 * time.Second
)

func TestSoak(t *testing.T) {
	if os.Getenv(envSoak) != "1" {
		t.Skipf("the soak runs only with %s=1: make soak [SOAK_DURATION=10m]", envSoak)
	}
	s, err := readSettings()
	if err != nil {
		t.Fatal(err)
	}
	if dl, ok := t.Deadline(); ok && time.Until(dl) < s.duration+setupSlack {
		t.Fatalf("go test -timeout leaves %v; the soak needs %v (duration) + %v", time.Until(dl).Round(time.Second), s.duration, setupSlack)
	}
	var running atomic.Pointer[egressd]
	watchdog := time.AfterFunc(s.duration+hardSlack, func() {
		if e := running.Load(); e != nil {
			e.Kill()
		}
		panic(fmt.Sprintf("soak: still running %v after the start of a %v load; goroutines follow", s.duration+hardSlack, s.duration))
	})
	defer watchdog.Stop()

	dir, err := os.MkdirTemp("", "egressd-soak-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s.keep || t.Failed() {
			t.Logf("kept %s (egressd.yaml, egressd.log, policy.json, state/)", dir)
			return
		}
		os.RemoveAll(dir)
	}()

	ports, err := egressdtest.FreePorts(2) // the policy allowlists them on 127.0.0.1: only the self guard refuses them
	if err != nil {
		t.Fatal(err)
	}
	tl := newTally()
	creds := newCredTracker(tl, rotationGrace)
	fx := startFixtures(t, tl, creds, fmt.Sprintf("127.0.0.1:%d", ports[1]))
	f, err := writeFiles(dir, fx, creds, ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	checkPolicies(t, s.bin, f, fx.dns.Addr)

	e, err := startEgressd(s.bin, f)
	if err != nil {
		t.Fatalf("starting egressd: %v", err)
	}
	running.Store(e)
	defer e.Kill()

	adminReload, err := e.hasAdminReload()
	if err != nil {
		t.Fatal(err)
	}
	egressdRoots, err := e.CAPool()
	if err != nil {
		t.Fatalf("egressd's CA: %v", err)
	}
	op := &operator{e: e, f: f, tally: tl, creds: creds, adminReload: adminReload, broken: f.brokenPolicies()}
	rep := &report{s: s, tally: tl, creds: creds, hooks: fx.up.hooks, adminRel: adminReload}
	if rep.idle, err = takeSample(e, 0); err != nil {
		t.Fatalf("sampling egressd: %v", err)
	}

	httpDenials, connectDenials := denials(f)
	l := &loader{
		e: e, f: f, tally: tl, hooks: fx.up.hooks, egressdRoots: egressdRoots, upstreamRoots: fx.ca.Pool,
		httpDenials: httpDenials, connectDenials: connectDenials,
		interval: time.Duration(s.clients) * time.Second / time.Duration(s.rate),
		// Twice the paced count: a bound, never reached at the pace.
		maxPerClient: int(2*s.duration.Seconds()*float64(s.rate)/float64(s.clients)) + 100,
	}
	clients := make([]*client, s.clients)
	for i := range clients {
		clients[i] = l.newClient(i)
	}
	evs := op.schedule(s.duration)
	t.Logf("soaking egressd (pid %d) for %v: %d clients at %d req/s, %d reloads and rotations scheduled, POST /v1/reload served: %v; dir %s",
		e.ServingPid(), s.duration, s.clients, s.rate, len(evs), adminReload, dir)

	rep.loadAvgStart = loadAvg()
	l.start = time.Now()
	l.stopAt = l.start.Add(s.duration)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); c.run() }()
	}
	opsDone := make(chan struct{})
	go func() { defer close(opsDone); op.run(l.start, evs, stop) }()

	var sampleErrs []string
	for i := 1; ; i++ {
		at := time.Duration(i) * sampleEvery
		if at >= s.duration {
			break
		}
		time.Sleep(time.Until(l.start.Add(at)))
		if !e.Alive() {
			t.Errorf("egressd exited (%d) during the load%s", e.ExitCode(), e.OutputTail(3000))
			break
		}
		smp, err := takeSample(e, at)
		if err != nil {
			sampleErrs = append(sampleErrs, fmt.Sprintf("sample at %v: %v", at, err))
			continue
		}
		rep.samples = append(rep.samples, smp)
		t.Logf("t=%-5v goroutines %4d  fds %4d  RSS %9s  tunnels %3d  requests %6d  violations %d",
			at, smp.goroutines, smp.fds, mib(smp.rss), smp.tunnels, requestsSoFar(tl), tl.violationCount())
	}

	// The load's end: clients finish the request in flight and stop.
	time.Sleep(time.Until(l.stopAt))
	close(stop)
	rep.loadTime = time.Since(l.start)
	rep.loadAvgEnd = loadAvg()
	if !waitTimeout(&wg, requestTimeout+5*time.Second) {
		rep.failures = append(rep.failures, "clients still busy after the load's end")
	}
	<-opsDone // op.run returns at stop; a reload in progress is bounded by reloadTimeout
	for _, c := range clients {
		c.closeIdle()
	}
	if err := waitTunnels(e, tunnelsDrain); err != nil {
		rep.failures = append(rep.failures, err.Error())
	}
	if rep.after, err = takeSample(e, time.Since(l.start)); err != nil {
		sampleErrs = append(sampleErrs, fmt.Sprintf("sample after the load: %v", err))
	}

	code, stopErr := e.Stop()
	rep.exitCode = code
	rep.logSummary = scanLog(f)
	rep.growth = checkGrowth(rep.samples)
	rep.failures = append(rep.failures, verdict(rep, evs, stopErr, sampleErrs)...)
	rep.write(os.Stdout)
	for _, msg := range rep.failures {
		t.Error(msg)
	}
}

// checkPolicies runs `egressd check` on the valid policy and on each broken one, so
// the soak's own premises hold before it starts: the first passes, the others fail.
func checkPolicies(t *testing.T, bin string, f *files, resolver string) {
	t.Helper()
	try := func(name string, policy []byte, wantOK bool) {
		p := filepath.Join(f.dir, "check-policy.json")
		c := filepath.Join(f.dir, "check.yaml")
		if err := os.WriteFile(p, policy, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c, f.configYAML(resolver, p), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "check", "--config", c).CombinedOutput()
		if ok := err == nil; ok != wantOK {
			t.Fatalf("egressd check on the soak's %s: ok=%v, want %v\n%s", name, ok, wantOK, out)
		}
		os.Remove(p)
		os.Remove(c)
	}
	try("valid policy", f.validPolicy(1), true)
	for _, b := range f.brokenPolicies() {
		try("broken policy ("+b.name+")", b.data, false)
	}
}

func requestsSoFar(tl *tally) int64 {
	var n int64
	for k := range numKinds {
		n += tl.ok[k].Load() + tl.wrong[k].Load() + tl.transport[k].Load() + tl.late[k].Load()
	}
	return n
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// waitTunnels waits until egressd counts no open tunnel: every client has closed
// its connections, so a tunnel still counted is a leak.
func waitTunnels(e *egressd, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		m, err := e.Metrics()
		if err == nil && m[seriesTunnels] == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("tunnels_active after the load: %v", err)
			}
			return fmt.Errorf("egressd_tunnels_active is %v %v after every client closed its connections: tunnels leak", m[seriesTunnels], within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// verdict lists why the soak failed; none means it passed.
func verdict(r *report, evs []event, stopErr error, sampleErrs []string) []string {
	var out []string
	fail := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if n := r.tally.violationCount(); n > 0 {
		fail("%d violations: requests served with the wrong policy, or broken promises (listed above)", n)
	}
	var transport, total int64
	for k := range numKinds {
		transport += r.tally.transport[k].Load()
		n := r.tally.ok[k].Load() + r.tally.wrong[k].Load() + r.tally.transport[k].Load() + r.tally.late[k].Load()
		total += n
		if n == 0 {
			fail("no %s requests were sent", kind(k))
		}
	}
	if transport > 0 {
		fail("%d transport errors during the load (listed above)", transport)
	}
	for _, g := range r.growth {
		if g.failed {
			fail("%s grew from %s (baseline) to %s (end): more than +%.0f%% and +%s", g.name, g.formatUnit(g.base),
				g.formatUnit(g.end), 100*g.limitRel, g.formatUnit(g.limitAbs))
		}
	}
	out = append(out, sampleErrs...)
	r.tally.mu.Lock()
	reloads := 0
	for _, n := range r.tally.reloadOK {
		reloads += n
	}
	for _, n := range r.tally.reloadRejected {
		reloads += n
	}
	ops := reloads + r.tally.rotations
	r.tally.mu.Unlock()
	if ops != len(evs) {
		fail("%d of %d scheduled reloads and rotations completed as they must", ops, len(evs))
	}
	if stopErr != nil {
		fail("%v", stopErr)
	} else if r.exitCode != 0 {
		fail("egressd exited %d after SIGTERM, want 0", r.exitCode)
	}
	ls := r.logSummary
	if len(ls.unexpected) > 0 {
		fail("egressd logged unexpected error lines (listed above)")
	}
	if ls.secretLeaks > 0 {
		fail("egressd logged a credential token %d times", ls.secretLeaks)
	}
	if ls.stderrBytes > 0 {
		fail("egressd wrote %d bytes to stderr: %s", ls.stderrBytes, ls.stderrExample)
	}
	if !ls.stoppedOK {
		fail(`egressd did not log "egressd stopped"`)
	}
	return out
}

// scanLog reads egressd's log: egress lines by decision, warnings by message,
// reload rejections (expected), every other error-level line (unexpected), and
// any line holding a credential token (a leak).
func scanLog(f *files) logSummary {
	ls := logSummary{decisions: map[string]int64{}, reloads: map[string]int64{}, warns: map[string]int64{}, unexpected: map[string]*group{}}
	unexpected := func(key, line string) {
		g := ls.unexpected[key]
		if g == nil {
			g = &group{}
			ls.unexpected[key] = g
		}
		g.add(truncate(line, 400))
	}
	if b, err := os.ReadFile(f.stderr); err == nil && len(b) > 0 {
		ls.stderrBytes, ls.stderrExample = len(b), truncate(string(b), 400)
	}
	fh, err := os.Open(f.log)
	if err != nil {
		unexpected("cannot read the log: "+err.Error(), "")
		return ls
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		ls.lines++
		if bytes.Contains(line, []byte(tokenPrefix)) {
			ls.secretLeaks++
			unexpected("a credential token in the log", redactLine(line))
		}
		var l struct{ Level, Message, Decision, Reason, Source string }
		if err := json.Unmarshal(line, &l); err != nil {
			unexpected("a line that is not JSON", string(line))
			continue
		}
		switch {
		case l.Message == "egress":
			ls.egress++
			key := l.Decision
			if l.Reason != "" {
				key += "/" + l.Reason
			}
			ls.decisions[key]++
		case l.Message == "egressd stopped":
			ls.stoppedOK = true
		case l.Message == "config reloaded":
			ls.reloads[l.Source+" ok"]++
		case l.Level == "warn":
			ls.warns[l.Message]++
		case l.Level == "error" && l.Message == "reload rejected; the running config stays in force":
			ls.reloads[l.Source+" rejected"]++
		case l.Level == "error" || l.Level == "fatal" || l.Level == "panic":
			unexpected(l.Level+": "+l.Message, string(line))
		}
	}
	if err := sc.Err(); err != nil {
		unexpected("reading the log: "+err.Error(), "")
	}
	return ls
}

// redactLine shows where a token appeared without printing it.
func redactLine(line []byte) string {
	i := bytes.Index(line, []byte(tokenPrefix))
	return truncate(string(line[:i]), 300) + "<token…>"
}
