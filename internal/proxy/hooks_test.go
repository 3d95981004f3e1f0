package proxy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/pkg/hookauth"
)

// hooksJSON declares a pre-tool security gate on policy.allowed.test (intercepted
// because it is a hook URL), one on port 8443 where nothing listens, one on a host
// that is not allowlisted, and a post-tool audit hook.
const hooksJSON = `{
  "security-gate": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
    {"type": "http", "url": "https://policy.allowed.test/pre", "timeout": 2},
    {"type": "http", "url": "https://policy.allowed.test:8443/pre", "timeout": 2},
    {"type": "http", "url": "https://evil.test/pre", "timeout": 2},
    {"type": "http", "url": "https://api.allowed.test/pre", "timeout": 2}]}]},
  "audit": {"post_tool_execution": [{"matcher": "*", "hooks": [
    {"type": "http", "url": "https://policy.allowed.test/post", "timeout": 5}]}]}
}`

var hookEntries = []allowlist.Entry{
	{Domain: "policy.allowed.test", Ports: []uint16{443, 8443}},
	{Domain: "api.allowed.test", Credential: "missing"},
}

func newHookWorld(t *testing.T) *world {
	w := newWorld(t, worldOpts{allowlist: hookEntries, hooksJSON: hooksJSON, hookBodyBytes: 4096,
		credentials: map[string]string{}})
	w.DNS.Set("policy.allowed.test", "A "+w.PublicIP)
	return w
}

// hookCall posts a tool-call body to url through egressd, as the runtime would.
func (w *world) hookCall(t *testing.T, url string) (int, map[string]any, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"tool":"code_execution","input":"ls"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Egressd-Hook-Assertion", "forged-by-the-sandbox")
	start := time.Now()
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body, time.Since(start)
}

func TestHookFailClosedMatrix(t *testing.T) {
	w := newHookWorld(t)
	endpoint := func(status int, body string, delay time.Duration) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			time.Sleep(delay)
			rw.WriteHeader(status)
			io.WriteString(rw, body)
		}
	}
	cases := []struct {
		name     string
		url      string
		handler  http.HandlerFunc
		decision string // what the runtime receives
		reason   string // substring of the deny reason
	}{
		{"allow", "/pre", endpoint(200, `{"decision":"allow"}`, 0), "allow", ""},
		{"deny", "/pre", endpoint(200, `{"decision":"deny","reason":"no curl"}`, 0), "deny", "no curl"},
		{"500", "/pre", endpoint(500, `{"decision":"allow"}`, 0), "deny", "endpoint returned 500"},
		{"403", "/pre", endpoint(403, `{"decision":"allow"}`, 0), "deny", "endpoint returned 403"},
		{"garbage body", "/pre", endpoint(200, `<html>oops`, 0), "deny", "not JSON"},
		{"unknown decision", "/pre", endpoint(200, `{"decision":"maybe"}`, 0), "deny", "maybe"},
		{"empty body", "/pre", endpoint(200, ``, 0), "deny", "empty"},
		{"oversized body", "/pre", endpoint(200, `{"decision":"allow","pad":"`+strings.Repeat("x", 8192)+`"}`, 0), "deny", "larger than"},
		{"hang past the timeout", "/pre", endpoint(200, `{"decision":"allow"}`, 3*time.Second), "deny", "timed out"},
		{"connection refused", ":8443/pre", nil, "deny", "upstream_unreachable"},
		{"not allowlisted", "evil", nil, "deny", "not_allowlisted"},
		{"credential unavailable", "api", nil, "deny", "credential_unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := "https://policy.allowed.test" + tc.url
			switch tc.url {
			case "evil":
				url = "https://evil.test/pre"
			case "api":
				url = "https://api.allowed.test/pre"
			}
			if tc.handler != nil {
				w.Upstream.set(tc.handler)
			}
			status, body, took := w.hookCall(t, url)
			if status != 200 || body["decision"] != tc.decision {
				t.Fatalf("runtime got %d %v, want 200 decision %q", status, body, tc.decision)
			}
			if reason, _ := body["reason"].(string); !strings.Contains(reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", reason, tc.reason)
			}
			if tc.decision == "deny" && tc.reason != "no curl" {
				if reason := body["reason"].(string); !strings.HasPrefix(reason, "egressd: ") || !strings.HasSuffix(reason, "(fail-closed)") {
					t.Errorf("reason %q is not egressd's fail-closed deny", reason)
				}
			}
			if took > 2*time.Second {
				t.Errorf("answered after %v, past the hook's 2 s timeout", took)
			}
			line := w.waitLog(t, func(l map[string]any) bool { return l["path"] == "/pre" && l["hook_event"] == "pre_tool_execution" })
			if line["hook_group"] != "security-gate" {
				t.Errorf("log hook_group %v", line["hook_group"])
			}
			w.logs.Reset()
		})
	}
}

func TestHookAssertionVerifies(t *testing.T) {
	w := newHookWorld(t)
	keys, err := hookauth.ParseJWKS(w.Signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := hookauth.NewVerifier(hookauth.Options{Audience: "https://policy.allowed.test", Env: "env_test", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	var claims *hookauth.Claims
	var verr, replayErr error
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		assertion := r.Header.Get(hookauth.HeaderName)
		claims, verr = verifier.Verify(context.Background(), assertion, body)
		_, replayErr = verifier.Verify(context.Background(), assertion, body)
		if _, err := verifier.Verify(context.Background(), assertion, append(bytes.Clone(body), ' ')); err == nil {
			verr = errString("a changed body verified")
		}
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	for _, path := range []string{"/pre", "/post"} {
		status, body, _ := w.hookCall(t, "https://policy.allowed.test"+path)
		if status != 200 || body["decision"] != "allow" {
			t.Fatalf("%s: %d %v", path, status, body)
		}
		if verr != nil {
			t.Fatalf("%s: the endpoint could not verify the assertion: %v", path, verr)
		}
		if replayErr == nil {
			t.Errorf("%s: a replayed assertion verified", path)
		}
		wantEvent := map[string]string{"/pre": "pre_tool_execution", "/post": "post_tool_execution"}[path]
		if claims.Event != wantEvent || claims.Env != "env_test" || claims.Ident != "url" || claims.Issuer != "egressd" {
			t.Errorf("%s: claims %+v", path, claims)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestHookKeepAliveNeverEvicted: at max_connections, a newcomer does not take the
// slot of the runtime's idle keep-alive connection whose last request was a
// pre-tool hook call (a close racing the runtime's reuse of it would reach the
// runtime as a reset, read as allow); the newcomer gets 503 overloaded, and the
// runtime's next call on its connection is answered.
func TestHookKeepAliveNeverEvicted(t *testing.T) {
	w := newWorld(t, worldOpts{allowlist: hookEntries, hooksJSON: hooksJSON, hookBodyBytes: 4096,
		credentials: map[string]string{}, limits: func(l *config.Limits) { l.MaxConnections = 1 }})
	w.DNS.Set("policy.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	if status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre"); status != 200 || body["decision"] != "allow" {
		t.Fatalf("first hook call: %d %v, want the endpoint's allow", status, body)
	}
	time.Sleep(50 * time.Millisecond) // the hook connection is now idle, waiting for its next call
	resp := w.raw("GET http://policy.allowed.test/x HTTP/1.1\r\nHost: policy.allowed.test\r\n\r\n")
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Egressd-Reason") != "overloaded" {
		t.Errorf("newcomer: %d %q, want 503 overloaded (the idle hook connection keeps its slot)",
			resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}
	if status, body, _ := w.hookCall(t, "https://policy.allowed.test/pre"); status != 200 || body["decision"] != "allow" {
		t.Errorf("second hook call on the kept connection: %d %v, want the endpoint's allow", status, body)
	}
}

// TestHookAnswerMislabelled: an endpoint's well-formed deny labelled with a
// Content-Encoding it does not have ("none", "UTF-8", "gzip" or "br" on plain
// JSON), on a hook host whose entry injects (so the answer is masked), reaches
// the runtime as that deny: the bytes egressd checked, masked, in identity
// encoding with their own length, and counted as a deny. Decoded by the label,
// it was a 502 or a body cut short, which the runtime reads as allow.
func TestHookAnswerMislabelled(t *testing.T) {
	const hookKey = "hook-key-0123456789"
	w := newWorld(t, worldOpts{hooksJSON: hooksJSON, hookBodyBytes: 4096, credentials: map[string]string{},
		allowlist: []allowlist.Entry{{Domain: "policy.allowed.test", Transform: []allowlist.Header{{Name: "X-Hook-Key", Value: hookKey}}}}})
	w.DNS.Set("policy.allowed.test", "A "+w.PublicIP)
	for _, coding := range []string{"none", "UTF-8", "gzip", "br", "identity, gzip"} {
		t.Run(coding, func(t *testing.T) {
			var acceptEncoding string
			w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				acceptEncoding = r.Header.Get("Accept-Encoding")
				rw.Header().Set("Content-Type", "application/json")
				rw.Header().Set("Content-Encoding", coding)
				io.WriteString(rw, `{"decision":"deny","reason":"no curl for `+r.Header.Get("X-Hook-Key")+`"}`)
			})
			denies := w.hookOutcomes("deny")
			req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", strings.NewReader(`{"tool":"code_execution"}`))
			req.Header.Set("Accept-Encoding", "gzip, br")
			resp, err := w.interceptingClient().Do(req)
			if err != nil {
				t.Fatalf("the runtime's call failed (%v): it reads that as allow", err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := `{"decision":"deny","reason":"no curl for ` + stars(len(hookKey)) + `"}`
			if err != nil || resp.StatusCode != 200 || string(body) != want {
				t.Fatalf("runtime got %d %q (%v), want the endpoint's deny, masked: %s", resp.StatusCode, body, err, want)
			}
			if ce := resp.Header.Get("Content-Encoding"); ce != "" || resp.ContentLength != int64(len(want)) {
				t.Errorf("answer labelled Content-Encoding %q, Content-Length %d; want none and %d", ce, resp.ContentLength, len(want))
			}
			if acceptEncoding != "identity" {
				t.Errorf("the endpoint was asked for Accept-Encoding %q, want identity", acceptEncoding)
			}
			// Counted once written: after the runtime may have read it.
			for deadline := time.Now().Add(time.Second); w.hookOutcomes("deny") == denies && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if got := w.hookOutcomes("deny") - denies; got != 1 {
				t.Errorf("hook_requests_total{outcome=deny} went up by %v, want 1", got)
			}
		})
	}
}

// hookOutcomes reads egressd_hook_requests_total{event=pre_tool_execution,outcome}.
func (w *world) hookOutcomes(outcome string) float64 {
	return testutil.ToFloat64(w.Metrics.HookRequests.WithLabelValues("pre_tool_execution", outcome))
}

// TestHookRuntimeAuth: with hooks.identify runtime_auth, a call to a hook URL is
// the runtime's only when its CONNECT (or request) presents the runtime's token
// as Proxy-Authorization (Basic with the token as password, or Bearer): it is
// signed (ident runtime_auth) and failed closed; the same call without the token
// is the sandbox's ordinary request, forwarded unsigned, and with every slot held
// it gets no hook lane. When the token cannot be read, calls to hook URLs are
// matched by URL (ident url) and failed closed rather than forwarded as anyone's.
func TestHookRuntimeAuth(t *testing.T) {
	const token = "runtime-token-0123456789"
	w := newLaneWorld(t, 2)
	var mu sync.Mutex
	var tokenErr error
	var idents []string
	snap := *w.Server.Snapshot()
	h := *snap.Hooks
	h.Identify = config.IdentifyRuntimeAuth
	h.RuntimeToken = func() ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		return []byte(token), tokenErr
	}
	snap.Hooks = &h
	w.Server.Swap(&snap)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		idents = append(idents, assertionIdent(r.Header.Get(hookauth.HeaderName)))
		mu.Unlock()
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	call := func(userinfo string) string {
		t.Helper()
		c := w.interceptingClient()
		pu, _ := url.Parse("http://" + userinfo + w.ProxyAddr)
		c.Transport.(*http.Transport).Proxy = http.ProxyURL(pu)
		req, _ := http.NewRequest("POST", "https://policy.allowed.test/pre", strings.NewReader(`{"tool":"code_execution"}`))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.CloseIdleConnections()
		time.Sleep(20 * time.Millisecond) // its slot is free again
		mu.Lock()
		defer mu.Unlock()
		return idents[len(idents)-1]
	}
	if got := call("runtime:" + token + "@"); got != "runtime_auth" {
		t.Errorf("call presenting the token: ident %q, want runtime_auth", got)
	}
	if got := call("runtime:wrong-token@"); got != "" {
		t.Errorf("call presenting another token: ident %q, want no assertion (not a hook call)", got)
	}
	if got := call(""); got != "" {
		t.Errorf("call without the token: ident %q, want no assertion (not a hook call)", got)
	}
	mu.Lock()
	tokenErr = errString("credential unavailable")
	mu.Unlock()
	if got := call(""); got != "url" {
		t.Errorf("call with the token unreadable: ident %q, want url (matched by URL, failed closed)", got)
	}
	mu.Lock()
	tokenErr = nil
	mu.Unlock()

	w.fillSlots(t, 2) // a call without the token gets no lane slot; one with it does
	raw := func(auth string) *http.Response {
		c, br := w.dialProxy(t)
		io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n"+auth+"\r\n")
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	assertRefusedStatus(t, raw(""), 503, "overloaded")
	if resp := raw("Proxy-Authorization: Bearer " + token + "\r\n"); resp.StatusCode != 200 {
		t.Errorf("CONNECT with the token, every slot held: %d, want 200 in the hook lane", resp.StatusCode)
	}
}

// assertionIdent is the ident claim of an Egressd-Hook-Assertion, "" without one.
func assertionIdent(jws string) string {
	parts := strings.Split(jws, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var c struct{ Ident string }
	json.Unmarshal(payload, &c)
	return c.Ident
}

// TestHookDeadlineFromAccept: a pre-tool call's deadline runs from when its
// connection was accepted, not from when its head arrived: the runtime's own
// timeout has been running through the CONNECT and the TLS handshake, which a
// flood can stretch. A call whose head comes late, to an endpoint that is slow,
// gets the deny within the hook's timeout of its connection's start.
func TestHookDeadlineFromAccept(t *testing.T) {
	w := newHookWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(5 * time.Second)
		io.WriteString(rw, `{"decision":"allow"}`)
	})
	start := time.Now()
	tc := w.slowHookConn(t)
	time.Sleep(time.Until(start.Add(1400 * time.Millisecond))) // as a flood would stretch CONNECT and TLS
	wantFailClosedDeny(t, "the late call", tc)
	// The hook's timeout is 2 s: from its connection's start, egressd answers by
	// 1.5 s (hooks.Deadline); from the head's arrival it would be past 2.9 s.
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("the deny came %v after the connection began, past the hook's 2 s timeout", took.Round(time.Millisecond))
	}
}
