package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRunLoad drives the upstream with GETs and the hook endpoint with
// POSTs for a moment, direct, and checks what both sides counted.
func TestRunLoad(t *testing.T) {
	up, hs := startServers(t, 64)
	lo := loadOptions{clients: 2, warmup: 50 * time.Millisecond, duration: 200 * time.Millisecond}
	get := target{url: (&world{up: up}).hostURL(transformHost), dialAddr: up.tlsAddr, roots: up.roots}
	r, err := runCounted(context.Background(), get, loadOptions{clients: 2, size: 64, duration: 200 * time.Millisecond}, up, nil)
	if err != nil || r.Total == 0 || r.Errors != 0 || r.ClientConns < 2 || r.UpstreamConns != r.ClientConns || r.UpstreamRequests != r.Total {
		t.Errorf("GET: %+v, %v", r, err)
	}

	// The upstream counts each injected value sent exactly once, by name.
	inj := get
	inj.header = http.Header{transformHeader: {transformValue}, "Authorization": {injectCredential.value}}
	r, err = runCounted(context.Background(), inj, loadOptions{clients: 1, size: 64, duration: 100 * time.Millisecond}, up, nil)
	if want := (map[string]int64{injectTransform.name: r.Total, injectCredential.name: r.Total}); err != nil || r.Total == 0 || len(r.Injected) != 2 ||
		r.Injected[injectTransform.name] != want[injectTransform.name] || r.Injected[injectCredential.name] != want[injectCredential.name] {
		t.Errorf("injected values counted %v of %d requests (%v)", r.Injected, r.Total, err)
	}
	inj.header = http.Header{transformHeader: {transformValue, transformValue}}
	if r, err = runCounted(context.Background(), inj, loadOptions{clients: 1, size: 64, duration: 50 * time.Millisecond}, up, nil); err != nil || len(r.Injected) != 0 {
		t.Errorf("a value sent twice counted: %v (%v)", r.Injected, err)
	}

	hb := hs.counts()
	post := target{url: hs.url(hookURLPath), dialAddr: hs.addr, roots: up.roots, method: http.MethodPost, body: hookRequestBody(), check: expectBody(hookAllow)}
	r, err = runLoad(context.Background(), post, lo, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := hs.counts().sub(hb)
	if r.Total == 0 || r.Errors != 0 || c[cServed] != r.Total || c[cBadBody] != 0 || c[cAsserted] != 0 || c[cAccepted] != r.ClientConns || r.ClientConns < 2 {
		t.Errorf("POST: %+v, endpoint %+v", r, c)
	}

	// A response the check refuses is an error of the run, not a failed run.
	bad := post
	bad.check = expectBody([]byte(`{"decision":"deny"}`))
	if r, err = runLoad(context.Background(), bad, lo, nil); err != nil || r.Errors == 0 || r.Requests != 0 {
		t.Errorf("refused bodies: %+v, %v", r, err)
	}
	// Nothing but loopback is dialled unless allowDial says so.
	away := get
	away.dialAddr = "192.0.2.1:443"
	if r, err = runLoad(context.Background(), away, loadOptions{clients: 1, size: 64, duration: 20 * time.Millisecond}, nil); err != nil || r.Errors == 0 || r.ClientConns != 0 {
		t.Errorf("a non-loopback dial: %+v, %v", r, err)
	}
}

func TestExpectChecks(t *testing.T) {
	resp := func(body string, hdr http.Header) *http.Response {
		return &http.Response{StatusCode: 200, Header: hdr, Body: io.NopCloser(strings.NewReader(body))}
	}
	if err := expectSize(3)(resp("abc", nil)); err != nil {
		t.Error(err)
	}
	if err := expectSize(3)(resp("abcd", nil)); err == nil {
		t.Error("expectSize(3) took 4 bytes")
	}
	if err := expectBody(hookAllow, "Egressd-Hook")(resp(hookAllowBody, http.Header{})); err != nil {
		t.Error(err)
	}
	if err := expectBody(hookAllow)(resp(hookAllowBody+" ", nil)); err == nil {
		t.Error("expectBody took a longer body")
	}
	deny := `{"decision":"deny","reason":"egressd: endpoint timed out (fail-closed)"}`
	if err := expectBody(hookAllow, "Egressd-Hook")(resp(deny, http.Header{"Egressd-Hook": {"fail-closed"}})); err == nil || !strings.Contains(err.Error(), "fail-closed") {
		t.Errorf("egressd's deny: %v", err)
	}
}
