package conformance_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/pkg/hookauth"
)

// downIP stands for a policy endpoint that is down: a public address that is not on
// lo, so that a dial to it fails at once ("network is unreachable").
const downIP = "93.184.216.99"

// hookTimeout is the timeout of every hook of the hooks world, in seconds.
const hookTimeout = 3 * time.Second

// hooksJSON is the hooks world's hooks.json: pre hooks on an endpoint that is down
// (https and http), one on the echo upstream's policy endpoint (answers allow), one
// whose URL is written with a dot segment, and one on the credential host whose
// deny comes mislabelled (hookMislabelledPath).
const hooksJSON = `{
  "security-gate": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
    {"type": "http", "url": "https://down.allowed.test/pre", "timeout": 3},
    {"type": "http", "url": "http://down.allowed.test/plain", "timeout": 3},
    {"type": "http", "url": "https://policy.allowed.test` + hookAllowPath + `", "timeout": 3},
    {"type": "http", "url": "https://written.allowed.test/v1/x/../check", "timeout": 3},
    {"type": "http", "url": "https://api.allowed.test` + hookMislabelledPath + `", "timeout": 3}
  ]}]}
}`

// hooksWorld is the strict world with hooksJSON and the endpoints' names.
func hooksWorld(t *testing.T, c config) *world {
	c.hooks = hooksJSON
	w := newWorld(t, c)
	w.DNS.Set("down.allowed.test", "A "+downIP)
	w.DNS.Set("written.allowed.test", "A "+downIP)
	w.DNS.Set("policy.allowed.test", "A "+publicIP)
	return w
}

// TestHookURLNormalised: a hook call whose path spells the hook URL in another RFC
// 3986 form (dot segments, percent-encoded unreserved characters, hex case) is the
// hook call: with the endpoint down it gets egressd's fail-closed deny, never a
// forwarded request's error; an allow from the endpoint passes through, signed.
// Spellings that are not the same URL (an encoded slash) are not hook calls.
func TestHookURLNormalised(t *testing.T) {
	w := hooksWorld(t, config{})
	for _, tc := range []struct{ name, host, path string }{
		{"as written", "down.allowed.test", "/pre"},
		{"dot-dot segment", "down.allowed.test", "/a/../pre"},
		{"dot segment", "down.allowed.test", "/./pre"},
		{"encoded unreserved", "down.allowed.test", "/%70re"},
		{"encoded dot-dot", "down.allowed.test", "/a/%2e%2E/pre"},
		{"above the root", "down.allowed.test", "/../../pre"},
		{"hooks.json written with a dot segment", "written.allowed.test", "/v1/check"},
		{"both spelled differently", "written.allowed.test", "/v1/y/%2E./%63heck"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			c := k.intercepted(tc.host)
			start := time.Now()
			k.send(c, "POST "+tc.path+" HTTP/1.1\r\nHost: "+tc.host+"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			k.assertFailClosed(k.response(c, http.MethodPost), start)
			k.assertUpstreamSaw(0)
		})
	}
	t.Run("explicit http, dot-dot segment", func(t *testing.T) {
		k := w.begin(t)
		start := time.Now()
		resp := k.raw("POST http://down.allowed.test/a/b/../../plain HTTP/1.1\r\nHost: down.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
		k.assertFailClosed(resp, start)
	})
	t.Run("endpoint allows, spelled with a dot segment", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("policy.allowed.test")
		k.send(c, "POST /hooks/x/../%61llow HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
		resp := k.response(c, http.MethodPost)
		if b := k.body(resp); resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allow"`) {
			t.Fatalf("got %d %s, want the endpoint's allow", resp.StatusCode, b)
		}
		saw := k.assertUpstreamSaw(1)
		if len(saw) == 1 && saw[0].Header.Get(hookauth.HeaderName) == "" {
			t.Errorf("the endpoint got the call without %s", hookauth.HeaderName)
		}
	})
	t.Run("encoded slash is another path", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("policy.allowed.test")
		k.send(c, "POST /hooks%2Fallow HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
		resp := k.response(c, http.MethodPost)
		k.body(resp)
		if resp.Header.Get("Egressd-Hook") != "" {
			t.Errorf("/hooks%%2Fallow was treated as the hook /hooks/allow")
		}
		if saw := k.assertUpstreamSaw(1); len(saw) == 1 && saw[0].Header.Get(hookauth.HeaderName) != "" {
			t.Errorf("a request that is not a hook call was signed")
		}
	})
}

// assertFailClosed asserts egressd's fail-closed deny, sent within the hook's timeout
// of start.
func (k *kase) assertFailClosed(resp *http.Response, start time.Time) {
	k.t.Helper()
	body := k.body(resp)
	took := time.Since(start)
	var d struct{ Decision, Reason string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &d) != nil || d.Decision != "deny" ||
		!strings.HasSuffix(d.Reason, "(fail-closed)") || resp.Header.Get("Egressd-Hook") != "fail-closed" {
		k.t.Fatalf("got %d %s %s, want egressd's fail-closed deny", resp.StatusCode, resp.Header, body)
	}
	if took > hookTimeout {
		k.t.Errorf("the deny came after %s, past the hook's timeout %s", took, hookTimeout)
	}
}

// TestHookDenyMislabelled: the endpoint, on a hook host whose entry injects a
// credential (api.allowed.test), answers a well-formed deny that reflects the
// credential and carries a Content-Encoding it does not have: "none", "UTF-8",
// "gzip" and "br" on plain JSON. The runtime reads the deny, masked, in identity
// encoding; decoded by the label, it was a 502 or a body cut short, which the
// runtime reads as allow.
func TestHookDenyMislabelled(t *testing.T) {
	w := hooksWorld(t, config{})
	for _, coding := range []string{"none", "UTF-8", "gzip", "br"} {
		t.Run(coding, func(t *testing.T) {
			k := w.begin(t)
			c := k.intercepted("api.allowed.test")
			k.send(c, "POST "+hookMislabelledPath+"?ce="+coding+" HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 2\r\n\r\n{}")
			resp := k.response(c, http.MethodPost)
			body := string(k.body(resp))
			var d struct{ Decision, Reason string }
			if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || d.Decision != "deny" ||
				!strings.HasPrefix(d.Reason, "no curl for ***") {
				t.Fatalf("the runtime got %d %q, want the endpoint's deny, its credential masked", resp.StatusCode, body)
			}
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				t.Errorf("the deny reached the runtime labelled Content-Encoding %q", ce)
			}
		})
	}
}
