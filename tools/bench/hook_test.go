package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/pkg/hookauth"
)

// startServers starts the upstream, with size-byte answers, and the hook
// endpoint, both closed at the test's end.
func startServers(t *testing.T, size int) (*upstream, *hookServer) {
	t.Helper()
	up, err := startUpstream(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.close)
	hs, err := startHookServer(up)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hs.close)
	return up, hs
}

// TestHookConfig: without the hook path the config has no hooks; with it,
// hooks.json names the endpoint as a pre_tool_execution hook (and the other
// path is no hook URL), and the config, with its entry, loads.
func TestHookConfig(t *testing.T) {
	up := testUpstream()
	cfg, files := benchConfig(up, "127.0.0.1:5353", nil, benchMaxConnections)
	if _, y := loadConfig(t, cfg, files); strings.Contains(y, "hook") {
		t.Errorf("config without the hook path names hooks:\n%s", y)
	}

	up.hook = &hookServer{addr: "127.0.0.1:2443"}
	cfg, files = benchConfig(up, "127.0.0.1:5353", nil, benchMaxConnections)
	loaded, y := loadConfig(t, cfg, files)
	for _, want := range []string{"domain: hook.bench.test", "ports: [2443]", "hooks:\n    file: hooks.json"} {
		if !strings.Contains(y, want) {
			t.Errorf("config lacks %q:\n%s", want, y)
		}
	}
	if filepath.Base(loaded.Hooks.File) != "hooks.json" {
		t.Errorf("hooks.file = %q", loaded.Hooks.File)
	}
	doc := []byte(files["hooks.json"])
	f, err := hooks.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	ix := hooks.NewIndex(f)
	m, ok := ix.Lookup("https", hookHost, 2443, hookURLPath)
	if !ok || m.Event != hooks.EventPre || m.Group != hookGroup || m.Timeout != hookTimeout*time.Second {
		t.Errorf("Lookup(%s) = %+v, %v", hookURLPath, m, ok)
	}
	if _, ok := ix.Lookup("https", hookHost, 2443, hookOtherPath); ok {
		t.Errorf("%s is a hook URL", hookOtherPath)
	}
	if !ix.Intercepts(hookHost, 2443) {
		t.Error("the hook's host is not intercepted")
	}
}

// TestHookServer: the endpoint answers allow, counts every request's
// assertion and transform, and verifies the sampled assertions with
// pkg/hookauth: egressd's own signature passes, a forged one does not.
func TestHookServer(t *testing.T) {
	up, hs := startServers(t, 16)
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := hooks.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := hookauth.ParseJWKS(signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.setVerifier(hookauth.Options{Keys: keys}); err != nil {
		t.Fatal(err)
	}
	aud, _ := hookauth.Origin(hs.url(hookURLPath))
	body := hookRequestBody()
	good, err := signer.SignCall(hooks.Match{Group: hookGroup, Event: hooks.EventPre, URL: hs.url(hookURLPath), Audience: aud}, envBench, hookauth.IdentURL, body)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: up.roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, hs.addr)
		}}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	post := func(assertion string, body []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, hs.url(hookURLPath), bytes.NewReader(body))
		if assertion != "" {
			req.Header.Set(hookauth.HeaderName, assertion)
		}
		req.Header.Set(transformHeader, transformValue)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := expectBody(hookAllow, "Egressd-Hook")(resp); err != nil || resp.StatusCode != 200 {
			t.Errorf("status %d: %v", resp.StatusCode, err)
		}
	}
	hs.sampleNext.Store(true)
	post(good, body)
	if c := hs.counts(); c[cServed] != 1 || c[cAsserted] != 1 || c[cTransform] != 1 || c[cVerified] != 1 || c[cRefused] != 0 || c[cBadBody] != 0 {
		t.Errorf("signed call: %+v", c)
	}
	post("", body)
	post(good, body) // not sampled: counted, not verified
	hs.sampleNext.Store(true)
	post("forged-by-the-sandbox", body)
	c := hs.counts()
	if c[cServed] != 4 || c[cAsserted] != 3 || c[cVerified] != 1 || c[cRefused] != 1 || hs.firstErr.Load() == nil {
		t.Errorf("after a forged assertion: %+v", c)
	}
	post("", body[:10])
	if hs.counts()[cBadBody] != 1 {
		t.Error("a short body was not counted")
	}
}

func TestHookProblems(t *testing.T) {
	ok := counts{cServed: 10, cTransform: 10, cAsserted: 10, cVerified: 1}
	if ps := hookProblems(hookCall, ok, 10, "egressd run"); len(ps) != 0 {
		t.Errorf("a good hook run: %v", ps)
	}
	if ps := hookProblems(hookOther, counts{cServed: 10, cTransform: 10}, 0, "egressd run"); len(ps) != 0 {
		t.Errorf("a good non-hook run: %v", ps)
	}
	if ps := hookProblems(hookDirect, counts{cServed: 10}, -1, "direct run"); len(ps) != 0 {
		t.Errorf("a good direct run: %v", ps)
	}
	for _, tc := range []struct {
		name   string
		kind   int
		c      counts
		allows int64
	}{
		{"one call unsigned", hookCall, counts{cServed: 10, cTransform: 10, cAsserted: 9, cVerified: 1}, 10},
		{"none verified", hookCall, counts{cServed: 10, cTransform: 10, cAsserted: 10}, 10},
		{"one refused", hookCall, counts{cServed: 10, cTransform: 10, cAsserted: 10, cVerified: 1, cRefused: 1}, 10},
		{"transform missing", hookCall, counts{cServed: 10, cTransform: 0, cAsserted: 10, cVerified: 1}, 10},
		{"metric short", hookCall, ok, 9},
		{"nothing arrived", hookCall, counts{}, 0},
		{"body changed", hookCall, counts{cServed: 10, cTransform: 10, cAsserted: 10, cVerified: 1, cBadBody: 1}, 10},
		{"non-hook signed", hookOther, counts{cServed: 10, cTransform: 10, cAsserted: 1}, 0},
		{"non-hook counted as hook", hookOther, counts{cServed: 10, cTransform: 10}, 1},
		{"direct signed", hookDirect, counts{cServed: 10, cAsserted: 1}, -1},
	} {
		if ps := hookProblems(tc.kind, tc.c, tc.allows, "run"); len(ps) == 0 {
			t.Errorf("%s: no problem found", tc.name)
		}
	}
}
