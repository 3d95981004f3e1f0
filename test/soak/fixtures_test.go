package soak_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/atomicfile"
	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/testpki"
	"github.com/egressd/egressd/pkg/hookauth"
)

// The names the soak uses, all under soak.test, which only the stub DNS answers.
const (
	environment = "env_soak"

	hostPlain     = "plain.soak.test"   // plain http, allowed, nothing injected
	hostSplice    = "splice.soak.test"  // CONNECT, spliced: the client sees the upstream's own certificate
	hostTransform = "xform.soak.test"   // CONNECT, intercepted: a transform sets transformHeader
	hostCred      = "cred.soak.test"    // CONNECT, intercepted: the file-backed credential sets Authorization
	hostPolicy    = "policy.soak.test"  // the hook policy endpoint (intercepted: a hook URL)
	hostPlaintext = "pt.soak.test"      // plain http to an entry with a credential: plaintext_credential
	hostMeta      = "meta.soak.test"    // allowlisted, resolves to 169.254.169.254: internal_address metadata
	hostPrivate   = "private.soak.test" // allowlisted, resolves to 10.0.0.5: internal_address private
	hostEvil      = "evil.soak.test"    // not allowlisted (it resolves to 127.0.0.1, so a leak would be seen)

	// literalMeta and literalPrivate are allowlisted IP literals: internal_address.
	literalMeta    = "169.254.169.254"
	literalPrivate = "10.0.0.7"
	privatePort    = 8080 // literalPrivate's one port
	// literalOther is an internal IP literal that no entry names: not_allowlisted.
	literalOther = "10.9.8.7"
	// literalSelf is egressd's own address; its listener and admin ports are
	// allowlisted on it, so only the self guard refuses them.
	literalSelf = "127.0.0.1"

	transformHeader = "X-Soak-Transform"
	transformValue  = "soak-transform-value"
	credentialID    = "soak-cred"
	tokenPrefix     = "soak-token-" // every credential token starts so; egressd must never log one

	hookGroup = "soak-gate"
	hookPre   = "/hooks/pre"
	hookPost  = "/hooks/post"
	// hookTimeout is the hooks' timeout in hooks.json, in seconds.
	hookTimeout = 5

	// idHeader carries the client's request ID, which the upstream echoes.
	idHeader = "X-Soak-Id"
)

// fixtures are the soak's in-process parts: the stub DNS, the upstream (plain and
// TLS) with the hook policy endpoint on it, and the credential tracker.
type fixtures struct {
	dns      *dnsstub.Server
	ca       *testpki.CA
	up       *upstream
	httpPort int
	tlsPort  int
}

// startFixtures starts the stub DNS and the upstream. adminAddr is egressd's admin
// listener (it serves the JWKS the hook endpoint verifies assertions with).
func startFixtures(t *testing.T, tl *tally, cr *credTracker, adminAddr string) *fixtures {
	t.Helper()
	fx := &fixtures{dns: dnsstub.Start(t), ca: testpki.New(t)}
	for _, h := range []string{hostPlain, hostSplice, hostTransform, hostCred, hostPolicy, hostPlaintext, hostEvil} {
		fx.dns.Set(h, "A 127.0.0.1")
	}
	fx.dns.Set(hostMeta, "A "+literalMeta)
	fx.dns.Set(hostPrivate, "A 10.0.0.5")
	fx.up = newUpstream(tl, cr)
	t.Cleanup(fx.up.Close)
	leaf := fx.ca.Leaf(t, "*.soak.test", "soak.test")
	fx.httpPort = fx.up.serve(t, nil)
	fx.tlsPort = fx.up.serve(t, &leaf)
	aud, err := hookauth.Origin(fmt.Sprintf("https://%s:%d", hostPolicy, fx.tlsPort))
	if err != nil {
		t.Fatal(err)
	}
	v, err := hookauth.NewVerifier(hookauth.Options{
		Audience: aud, Env: environment, JWKSURL: "http://" + adminAddr + "/.well-known/jwks.json",
		HTTPClient: &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.up.hooks.verifier.Store(v)
	return fx
}

// upstream is internal/testutil/echo on two ports, answering every allowed request
// with what it received, and serving the hook policy endpoint on hostPolicy. It
// records a violation itself for what only it can see: a request for a host that
// egressd must have denied, and a credential that is stale after the rotation grace.
type upstream struct {
	*echo.Server
	tally *tally
	creds *credTracker
	hooks *hookEndpoint
}

func newUpstream(tl *tally, cr *credTracker) *upstream {
	u := &upstream{tally: tl, creds: cr, hooks: &hookEndpoint{tally: tl}}
	// Forget: the soak sends hundreds of requests a second for minutes.
	u.Server = &echo.Server{Route: u.route, Redact: mark, Inspect: u.classify, Forget: true}
	return u
}

// seen is what the upstream saw of a request, as the load checks it.
type seen struct {
	ID        string
	Host      string
	TLS       bool
	Proto     string
	Transform []string
	Auth      []string
	Egressd   []string // names of Egressd-* headers
	Cred      string   // the credential's class, on hostCred (credTracker.classify)
}

// seenOf reads the echo's answer.
func seenOf(r echo.Request) seen {
	return seen{ID: r.Header.Get(idHeader), Host: hostOf(r.Host), TLS: r.TLS, Proto: r.Proto,
		Transform: r.Header.Values(transformHeader), Auth: r.Header.Values("Authorization"),
		Egressd: egressdHeaders(r.Header), Cred: r.Note}
}

func (u *upstream) serve(t *testing.T, cert *tls.Certificate) int {
	t.Helper()
	port, err := u.Listen("127.0.0.1:0", cert)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// hostOf is r.Host's name, lower-cased, without a port.
func hostOf(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(host)
}

// route serves the policy endpoint and refuses the hosts egressd must have denied;
// the allowed hosts are echoed.
func (u *upstream) route(w http.ResponseWriter, r *http.Request) bool {
	switch hostOf(r.Host) {
	case hostPolicy:
		u.hooks.serve(w, r)
	case hostPlain, hostSplice, hostTransform, hostCred:
		return false
	default:
		u.tally.violation("upstream reached for a denied host", "%s %s%s (%s)", r.Method, r.Host, r.URL.Path, r.Header.Get(idHeader))
		http.Error(w, "soak upstream: this host must have been denied", http.StatusTeapot)
	}
	return true
}

// classify notes the class of the credential a hostCred request carried, judged on
// the token as received (the echo's answer carries it masked).
func (u *upstream) classify(r *http.Request, got *echo.Request) {
	if hostOf(r.Host) == hostCred {
		got.Note = u.creds.classify(r.Header.Values("Authorization"), r.Header.Get(idHeader))
	}
}

// egressdHeaders lists the names of the Egressd-* headers in h.
func egressdHeaders(h http.Header) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "egressd-") {
			out = append(out, k)
		}
	}
	return out
}

// hookEndpoint is the pre/post tool-execution policy endpoint. It verifies every
// call's assertion with pkg/hookauth against egressd's JWKS, answers pre-tool calls
// allow and deny alternately and post-tool calls with an acknowledgement, and
// records each answer under the call's ID so the client can check that egressd
// passed exactly that answer on.
type hookEndpoint struct {
	tally    *tally
	verifier atomic.Pointer[hookauth.Verifier]
	calls    atomic.Int64 // pre-tool calls answered
	answers  sync.Map     // call ID -> hookAnswer
}

// hookAnswer is what the endpoint made of one call.
type hookAnswer struct {
	body    []byte // what it answered
	problem string // why the assertion or its claims did not verify; "" when they did
}

// toolCall is the body the soak's runtime stand-in posts to a hook URL.
type toolCall struct {
	ToolCall struct {
		Name string `json:"name"`
		Args struct {
			Cmd  string `json:"cmd"`
			Call string `json:"call"`
		} `json:"args"`
	} `json:"tool_call"`
}

func (h *hookEndpoint) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, hookauth.DefaultMaxBodyBytes+1))
	var call toolCall
	if err == nil {
		err = json.Unmarshal(body, &call)
	}
	id := call.ToolCall.Args.Call
	event := map[string]string{hookPre: hookauth.EventPreTool, hookPost: hookauth.EventPostTool}[r.URL.Path]
	var answer []byte
	switch {
	case err != nil || id == "" || event == "" || r.Method != http.MethodPost:
		// Not the call the client sent: egressd changed it on the way.
		h.tally.violation("hook call malformed at the endpoint", "%s %s: %v (call %q)", r.Method, r.URL.Path, err, id)
		answer = []byte(`{"decision":"deny","reason":"soak endpoint: malformed call"}`)
	default:
		// A call that does not verify is denied, as a real endpoint would; the client
		// counts it as served with the wrong policy (egressd must sign every call).
		problem := h.verify(r, body, event)
		switch {
		case problem != "":
			answer = fmt.Appendf(nil, `{"decision":"deny","reason":"soak endpoint: unverified call %s"}`, id)
		case event == hookauth.EventPostTool:
			answer = fmt.Appendf(nil, `{"ok":true,"soak_call":%q}`, id)
		case h.calls.Add(1)%2 == 1:
			answer = fmt.Appendf(nil, `{"decision":"allow","soak_call":%q}`, id)
		default:
			answer = fmt.Appendf(nil, `{"decision":"deny","reason":"soak endpoint denies call %s","soak_call":%q}`, id, id)
		}
		h.answers.Store(id, hookAnswer{answer, problem})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	_, _ = w.Write(answer)
}

// verify checks the call's assertion and its claims; it returns "" when they hold.
func (h *hookEndpoint) verify(r *http.Request, body []byte, event string) string {
	v := h.verifier.Load()
	if v == nil {
		return "no verifier yet"
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	c, err := v.Verify(ctx, r.Header.Get(hookauth.HeaderName), body)
	switch {
	case err != nil:
		return hookauth.Code(err) + ": " + err.Error()
	case c.Event != event || c.Group != hookGroup || c.Env != environment || c.Ident != hookauth.IdentURL:
		return fmt.Sprintf("claims event %q group %q env %q ident %q, want %q %q %q %q",
			c.Event, c.Group, c.Env, c.Ident, event, hookGroup, environment, hookauth.IdentURL)
	}
	return ""
}

// answered returns, and forgets, what the endpoint made of call id.
func (h *hookEndpoint) answered(id string) (hookAnswer, bool) {
	v, ok := h.answers.LoadAndDelete(id)
	if !ok {
		return hookAnswer{}, false
	}
	return v.(hookAnswer), true
}

// credTracker knows the credential's tokens: the current one, the one before it and
// when it was replaced. A token the upstream sees is current, the previous one within
// the rotation grace ("grace"), the previous one after it ("stale", a violation), or
// none of them ("unknown", a violation).
type credTracker struct {
	tally *tally
	grace time.Duration

	mu        sync.Mutex
	version   int
	cur, prev string
	rotatedAt time.Time

	current, inGrace, stale, unknown atomic.Int64
}

func newCredTracker(tl *tally, grace time.Duration) *credTracker {
	c := &credTracker{tally: tl, grace: grace}
	c.rotate()
	return c
}

// rotate makes a new token current and returns it. Call it before the file is
// rewritten, so the upstream knows the new token before egressd can send it.
func (c *credTracker) rotate() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version++
	c.prev, c.cur = c.cur, fmt.Sprintf("%sv%d-%d", tokenPrefix, c.version, time.Now().UnixNano())
	c.rotatedAt = time.Now()
	return c.cur
}

// file is the credentials file for the current token.
func (c *credTracker) file() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Appendf(nil, "{%q: {\"token\": %q}}\n", credentialID, c.cur)
}

func (c *credTracker) classify(auth []string, id string) string {
	c.mu.Lock()
	cur, prev, since := c.cur, c.prev, time.Since(c.rotatedAt)
	c.mu.Unlock()
	switch {
	case len(auth) == 1 && auth[0] == "Bearer "+cur:
		c.current.Add(1)
		return "current"
	case len(auth) == 1 && prev != "" && auth[0] == "Bearer "+prev && since <= c.grace:
		c.inGrace.Add(1)
		return "grace"
	case len(auth) == 1 && prev != "" && auth[0] == "Bearer "+prev:
		c.stale.Add(1)
		c.tally.violation("stale credential after the rotation grace", "request %s: the previous token %v after the rotation", id, since.Round(time.Millisecond))
		return "stale"
	default:
		c.unknown.Add(1)
		c.tally.violation("wrong credential", "request %s: Authorization %s", id, redactTokens(auth))
		return "unknown"
	}
}

// redactTokens describes Authorization values without printing a token whole.
// transformMark and tokenMark stand for the injected values in the upstream's
// echo: egressd masks any value it injected in the response (scrubbing), so the
// echo names them by mark; the credential check itself runs at the upstream
// (credTracker), on the real values.
const (
	transformMark = "<soak-transform>"
	tokenMark     = "<soak-token>"
)

// mark is the echo's Redact: an injected value becomes its mark.
func mark(v string) string {
	switch {
	case v == transformValue:
		return transformMark
	case strings.HasPrefix(v, "Bearer "+tokenPrefix):
		return "Bearer " + tokenMark
	}
	return v
}

func redactTokens(vals []string) string {
	out := make([]string, len(vals))
	for i, v := range vals {
		if len(v) > 24 {
			v = v[:24] + "…"
		}
		out[i] = strconv.Quote(v)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// files are the config files the soak writes for egressd, in one directory.
type files struct {
	dir        string
	config     string // egressd.yaml
	policy     string // policy.json (policy.file), rewritten by the reloads
	hooks      string // hooks.json (hooks.file)
	creds      string // credentials.json, rewritten by the rotations
	upstreamCA string
	stateDir   string
	log        string // egressd's stdout: its JSON log
	stderr     string

	proxyPort, adminPort int
	httpPort, tlsPort    int
}

// policyEntries is the allowlist every decision the load checks rests on. A valid
// reload adds a spare entry (a name the load never uses) and rotates the order,
// which changes the policy's hash but no decision.
func (f *files) policyEntries() []map[string]any {
	return []map[string]any{
		{"domain": hostPlain, "ports": []int{f.httpPort}},
		{"domain": hostSplice, "ports": []int{f.tlsPort}},
		{"domain": hostTransform, "ports": []int{f.tlsPort}, "transform": map[string]string{transformHeader: transformValue}},
		{"domain": hostCred, "ports": []int{f.tlsPort}, "credential": credentialID},
		{"domain": hostPolicy, "ports": []int{f.tlsPort}},
		{"domain": hostPlaintext, "ports": []int{f.httpPort}, "credential": credentialID},
		{"domain": hostMeta},
		{"domain": hostPrivate},
		{"domain": literalMeta},
		{"domain": literalPrivate, "ports": []int{privatePort}},
		{"domain": literalSelf, "ports": []int{f.proxyPort, f.adminPort}},
	}
}

// validPolicy is the n-th valid policy file.
func (f *files) validPolicy(n int) []byte {
	entries := f.policyEntries()
	k := n % len(entries)
	spare := map[string]any{"domain": fmt.Sprintf("spare-%d.soak.test", n), "ports": []int{443}}
	return policyDoc(slices.Concat(entries[k:], entries[:k], []map[string]any{spare}))
}

// brokenPolicy is a policy file egressd must reject, and what is wrong with it.
type brokenPolicy struct {
	name string
	data []byte
}

// brokenPolicies are policy files egressd must reject. Each would also open
// everything ("*") if it were taken, so a reload that failed open would turn the
// load's denials into violations at once.
func (f *files) brokenPolicies() []brokenPolicy {
	star := append([]map[string]any{{"domain": "*"}}, f.policyEntries()...)
	valid := policyDoc(star)
	return []brokenPolicy{
		{"truncated JSON", valid[:len(valid)/2]},
		{"port 0", policyDoc(slices.Concat(star, []map[string]any{{"domain": "bad.soak.test", "ports": []int{0}}}))},
		{"entry without a domain", policyDoc(slices.Concat(star, []map[string]any{{"ports": []int{443}}}))},
	}
}

func policyDoc(entries []map[string]any) []byte {
	b, err := json.MarshalIndent(map[string]any{"network": map[string]any{"allowlist": entries}}, "", "  ")
	if err != nil {
		panic(err) // maps of strings and ints always marshal
	}
	return append(b, '\n')
}

// hooksJSON declares one group with a pre-tool gate and a post-tool audit hook, both
// on the policy endpoint.
func (f *files) hooksJSON() []byte {
	url := fmt.Sprintf("https://%s:%d", hostPolicy, f.tlsPort)
	return fmt.Appendf(nil, `{
  %q: {
    "pre_tool_execution": [{"matcher": "code_execution", "hooks": [
      {"type": "http", "url": "%s%s", "timeout": %d}]}],
    "post_tool_execution": [{"matcher": "*", "hooks": [
      {"type": "http", "url": "%s%s", "timeout": %d}]}]
  }
}
`, hookGroup, url, hookPre, hookTimeout, url, hookPost, hookTimeout)
}

// configYAML is egressd.yaml naming policyPath as the policy file.
func (f *files) configYAML(resolver, policyPath string) []byte {
	failClosed := true
	cfg := &egressdtest.Config{
		Version: 1, Environment: environment,
		Listeners: []egressdtest.Listener{{Name: "sandbox", Address: fmt.Sprintf("127.0.0.1:%d", f.proxyPort), Mode: "proxy", Role: "sandbox"}},
		Admin:     &egressdtest.Admin{Address: fmt.Sprintf("127.0.0.1:%d", f.adminPort)},
		Policy:    egressdtest.Policy{File: policyPath},
		// resolver: the soak's stub (answers *.soak.test only, forwards nothing);
		// 127.0.0.0/8 opened: the upstream is on loopback (development and tests only).
		Network: egressdtest.Network{Resolver: resolver, UnsafeAllowCIDRs: []string{"127.0.0.0/8"}},
		// deny_in_tunnel never: the denied-CONNECT load checks the CONNECT's own 403.
		TLS:         &egressdtest.TLS{Intercept: "auto", DenyInTunnel: "never", UpstreamCAFile: f.upstreamCA},
		Credentials: &egressdtest.Credentials{Backend: "file", File: f.creds},
		// identify url: the soak's clients make the runtime's hook calls through the
		// sandbox's listener, and the endpoint checks the assertion says so.
		Hooks:    &egressdtest.Hooks{File: f.hooks, FailClosed: &failClosed, Identify: "url"},
		Log:      &egressdtest.Log{Level: "info", Format: "json"},
		StateDir: f.stateDir,
	}
	b, err := cfg.YAML()
	if err != nil {
		panic(err) // plain structs always marshal
	}
	return b
}

// writeFiles writes every file egressd's config names into dir; egressd will
// listen on proxyPort and adminPort.
func writeFiles(dir string, fx *fixtures, cr *credTracker, proxyPort, adminPort int) (*files, error) {
	f := &files{
		dir: dir, config: filepath.Join(dir, "egressd.yaml"), policy: filepath.Join(dir, "policy.json"),
		hooks: filepath.Join(dir, "hooks.json"), creds: filepath.Join(dir, "credentials.json"),
		upstreamCA: filepath.Join(dir, "upstream-ca.pem"), stateDir: filepath.Join(dir, "state"),
		log: filepath.Join(dir, egressdtest.LogName), stderr: filepath.Join(dir, egressdtest.StderrName),
		proxyPort: proxyPort, adminPort: adminPort, httpPort: fx.httpPort, tlsPort: fx.tlsPort,
	}
	for path, data := range map[string][]byte{
		f.upstreamCA: fx.ca.PEM(),
		f.policy:     f.validPolicy(0),
		f.hooks:      f.hooksJSON(),
		f.creds:      cr.file(),
		f.config:     f.configYAML(fx.dns.Addr, filepath.Join(dir, "policy.json")),
	} {
		if err := atomicfile.Write(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}
