package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/egressd/egressd/pkg/hookauth"
)

// The hook path: a pre_tool_execution hook call, as an agent runtime makes it
// before every tool call, through egressd, which signs the POST body, forwards
// it and checks the endpoint's decision. It is compared with the same POSTs to
// a URL of the same entry that is no hook's, so the difference is what a hook
// call adds. The endpoint runs in the bench process with the upstream's leaf.

const (
	hookHost      = "hook." + benchZone
	hookURLPath   = "/pre"   // the hook URL's path in hooks.json
	hookOtherPath = "/audit" // a path of the same entry that no hook names
	hookOtherRow  = "intercept-post"
	hookGroup     = "bench-gate"
	hookTimeout   = 10 // seconds, in hooks.json
	hookBodySize  = 512
	// hookAllowBody is what the client must get back unchanged: egressd's
	// fail-closed deny is anything else.
	hookAllowBody = `{"decision":"allow"}`
	// hookVerifyEvery: the endpoint verifies the first assertion of every run
	// and then every hookVerifyEvery-th with pkg/hookauth, which is too slow
	// for every request.
	hookVerifyEvery = 1024
	hookMaxBody     = 64 << 10
	envBench        = "env_bench" // the env claim of every assertion
)

var hookAllow = []byte(hookAllowBody)

// hooksJSON is the hooks.json egressd reads (hooks.file): one group, one
// pre_tool_execution rule, one http hook. %s is the hook URL.
const hooksJSON = `{"` + hookGroup + `": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [{"type": "http", "url": %q, "timeout": %d}]}]}}
`

// hookServer is the policy endpoint: it reads each POST, counts what arrived
// and answers hookAllowBody.
type hookServer struct {
	tally
	addr       string // 127.0.0.1:port
	verifier   atomic.Pointer[hookauth.Verifier]
	sampleNext atomic.Bool            // verify the next assertion (armed before each run)
	firstErr   atomic.Pointer[string] // the first refusal, for the report
}

// startHookServer serves the endpoint with the upstream's leaf, which egressd trusts.
func startHookServer(up *upstream) (*hookServer, error) {
	h := &hookServer{}
	addrs, err := h.serve(h.ServeHTTP, &up.cert)
	if err != nil {
		return nil, err
	}
	h.addr = addrs[0]
	return h, nil
}

func (h *hookServer) close() { h.srv.Close() }

// url is https://hookHost:<port><path>.
func (h *hookServer) url(path string) string { return "https://" + hostAt(hookHost, h.addr) + path }

// trust makes the endpoint verify sampled assertions against e's signing key,
// which pkg/hookauth reads from e's /.well-known/jwks.json, as a policy
// endpoint does.
func (h *hookServer) trust(e *egressd) error {
	return h.setVerifier(hookauth.Options{JWKSURL: "http://" + e.Admin + "/.well-known/jwks.json"})
}

// setVerifier makes the endpoint verify with o, for the hook URL's origin and
// the bench's environment.
func (h *hookServer) setVerifier(o hookauth.Options) error {
	var err error
	if o.Audience, err = hookauth.Origin(h.url(hookURLPath)); err != nil {
		return err
	}
	o.Env = envBench
	v, err := hookauth.NewVerifier(o)
	if err == nil {
		h.verifier.Store(v)
	}
	return err
}

// ServeHTTP reads the body, counts what the request carried and answers
// hookAllowBody: what a policy endpoint that allows does.
func (h *hookServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, hookMaxBody))
	h.n[cServed].Add(1)
	if r.Method != http.MethodPost || err != nil || len(body) != hookBodySize {
		h.n[cBadBody].Add(1)
	}
	h.countInjected(r)
	if v := r.Header[hookauth.HeaderName]; len(v) == 1 && v[0] != "" {
		n := h.n[cAsserted].Add(1)
		if h.sampleNext.CompareAndSwap(true, false) || n%hookVerifyEvery == 0 {
			h.verify(r.Context(), v[0], body)
		}
	}
	hdr := w.Header()
	hdr["Content-Type"] = []string{"application/json"}
	hdr["Content-Length"] = []string{strconv.Itoa(len(hookAllow))}
	_, _ = w.Write(hookAllow)
}

// verify checks one assertion with pkg/hookauth, counting it verified or
// refused; the first refusal is kept for the report.
func (h *hookServer) verify(ctx context.Context, assertion string, body []byte) {
	err := errors.New("no verifier: the endpoint trusts no egressd")
	if v := h.verifier.Load(); v != nil {
		_, err = v.Verify(ctx, assertion, body)
	}
	if err == nil {
		h.n[cVerified].Add(1)
		return
	}
	h.n[cRefused].Add(1)
	why := err.Error()
	h.firstErr.CompareAndSwap(nil, &why)
}

// hookRequestBody is the tool call every POST sends: hookBodySize bytes of
// JSON in the shape of a runtime's pre_tool_execution call.
func hookRequestBody() []byte {
	const head = `{"hook_event_name":"pre_tool_execution","session_id":"bench-session-0001","tool_name":"code_execution","tool_input":{"language":"python","code":"import os\nprint(os.listdir('.'))\n`
	const tail = `"}}`
	return []byte(head + strings.Repeat("#", hookBodySize-len(head)-len(tail)) + tail)
}

func hookPathSpec() pathSpec {
	return pathSpec{
		name: "hook",
		desc: fmt.Sprintf("POST of a %d-byte JSON tool call to https://%s:<port>%s, a pre_tool_execution hook URL in hooks.json, keep-alive; through egressd intercepted, "+
			"the body read, signed (%s), forwarded, and the endpoint's %s buffered and checked; compared with %s", hookBodySize, hookHost, hookURLPath, hookauth.HeaderName, hookAllowBody, hookOtherRow),
		inject:  injectTransform, // the entry's transform: egressd's CA is needed
		measure: measureHook,
	}
}

// measureHook runs, per round, the POSTs direct to the endpoint, then through
// egressd to the hook URL and to the other URL of the same entry, and returns
// the hook row, the intercept-post row (both sharing the direct runs) and the
// hook-attack row.
func measureHook(ctx context.Context, env pathEnv) ([]pathResult, error) {
	w, hs := env.w, env.w.up.hook
	if err := hs.trust(env.e); err != nil {
		return nil, err
	}
	direct := target{url: hs.url(hookURLPath), dialAddr: hs.addr, roots: w.up.roots,
		method: http.MethodPost, body: hookRequestBody(), check: expectBody(hookAllow, "Egressd-Hook")}
	call := direct
	call.dialAddr, call.proxy, call.roots = "", w.proxy, w.egressdRoots
	other := call
	other.url = hs.url(hookOtherPath)
	injects := transformHeader + " (transform)"
	var dc counts // the last direct run's, checked with each row's run
	hook := newRow("hook", hookPathSpec().desc, injects+" and "+hookauth.HeaderName+" (signed)")
	post := newRow(hookOtherRow, fmt.Sprintf("the hook row's POSTs to https://%s:<port>%s: the same entry and transform, but no hook URL, so intercepted and forwarded as any request (the hook row's direct runs)", hookHost, hookOtherPath), injects)
	rows := []*row{hookRow(ctx, env, &dc, call, hookCall, hook), hookRow(ctx, env, &dc, other, hookOther, post)}
	runDirect := func(int) (d runResult, err error) {
		d, dc, err = hs.run(ctx, direct, env.o.load(), nil)
		return d, err
	}
	if err := runRounds(env, runDirect, rows, nil); err != nil {
		return nil, err
	}
	attacked, err := measureHookUnderAttack(ctx, env)
	if err != nil {
		return nil, err
	}
	return append(finishAll(rows), attacked), nil
}

// hookRow is r with runs of t through egressd, checked as kind, each after a
// direct run whose counts *direct holds, with the endpoint's first assertion
// sampled and egressd's allowed hook calls (/metrics) counted.
func hookRow(ctx context.Context, env pathEnv, direct *counts, t target, kind int, r *row) *row {
	var c counts
	var allows int64 // -1 when /metrics could not be read
	hs := env.w.up.hook
	r.e = env.e
	r.run = func(cpu cpuFunc) (x runResult, err error) {
		hs.sampleNext.Store(true)
		before, beforeErr := hookAllows(env.e)
		x, c, err = hs.run(ctx, t, env.o.load(), cpu)
		allows = -1
		if after, err := hookAllows(env.e); err == nil && beforeErr == nil {
			allows = after - before
		}
		return x, err
	}
	r.check = func(round int, _ runResult, _ *viaRun) []string {
		ps := hookProblems(hookDirect, *direct, 0, runLabel("direct", round, env.o.rounds))
		ps = append(ps, hookProblems(kind, c, allows, runLabel("egressd", round, env.o.rounds))...)
		if msg := hs.firstErr.Load(); c[cRefused] > 0 && msg != nil {
			ps = append(ps, "first refusal: "+*msg)
		}
		return ps
	}
	return r
}

// run is runLoad of t with what the endpoint counted of it.
func (h *hookServer) run(ctx context.Context, t target, lo loadOptions, cpu cpuFunc) (runResult, counts, error) {
	before := h.counts()
	r, err := runLoad(ctx, t, lo, cpu)
	c := h.counts().sub(before)
	r.fill(c)
	return r, c, err
}

// Kinds of hook-path runs, for hookProblems.
const (
	hookDirect = iota // direct to the endpoint: nothing injected, nothing signed
	hookCall          // through egressd to the hook URL: transform and assertion on every request
	hookOther         // through egressd to the other URL: transform, no assertion
)

// hookProblems checks one run's counts at the endpoint. allows is how much
// egressd_hook_requests_total{event="pre_tool_execution",outcome="allow"} grew
// during it, or -1 when /metrics could not be read.
func hookProblems(kind int, c counts, allows int64, label string) []string {
	n, hdr, metric := c[cServed], hookauth.HeaderName, "egressd_hook_requests_total{pre_tool_execution,allow}"
	call, other := kind == hookCall, kind == hookOther
	checks := []struct {
		bad bool
		msg string
	}{
		{c[cBadBody] > 0, fmt.Sprintf("%d of %d requests reached the endpoint as something else than a POST of the %d-byte body sent", c[cBadBody], n, hookBodySize)},
		{kind != hookDirect && n == 0, "no request reached the endpoint"},
		{kind == hookDirect && (c[cTransform] > 0 || c[cAsserted] > 0), fmt.Sprintf("%d of %d requests carried %s and %d %s, which only egressd sets", c[cTransform], n, transformHeader, c[cAsserted], hdr)},
		{call && c[cAsserted] != n, fmt.Sprintf("%d of %d hook calls reached the endpoint with exactly one %s", c[cAsserted], n, hdr)},
		{kind != hookDirect && c[cTransform] != n, fmt.Sprintf("%d of %d requests carried %s as configured", c[cTransform], n, transformHeader)},
		{call && c[cRefused] > 0, fmt.Sprintf("pkg/hookauth refused %d of %d sampled assertions", c[cRefused], c[cRefused]+c[cVerified])},
		{call && c[cRefused] == 0 && n > 0 && c[cVerified] == 0, "no assertion was verified with pkg/hookauth"},
		{call && allows >= 0 && allows != n, fmt.Sprintf("%s grew by %d, the endpoint answered %d", metric, allows, n)},
		{other && c[cAsserted] > 0, fmt.Sprintf("%d of %d requests carried %s, though their URL is no hook's", c[cAsserted], n, hdr)},
		{other && allows > 0, fmt.Sprintf("%s grew by %d during requests to a URL that is no hook's", metric, allows)},
	}
	var out []string
	for _, ch := range checks {
		if ch.bad {
			out = append(out, label+": "+ch.msg)
		}
	}
	return out
}

// hookAllows reads egressd_hook_requests_total{event="pre_tool_execution",
// outcome="allow"} from egressd's /metrics; an absent series is 0 (no call yet).
func hookAllows(e *egressd) (int64, error) {
	n, err := e.metric(`egressd_hook_requests_total{event="pre_tool_execution",outcome="allow"}`)
	return max(n, 0), err
}
