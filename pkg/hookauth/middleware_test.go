package hookauth_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/egressd/egressd/pkg/hookauth"
)

func TestMiddleware(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, func(o *hookauth.Options) { o.MaxBodyBytes = 1024 })
	var gotBody []byte
	var gotClaims *hookauth.Claims
	endpoint := httptest.NewServer(hookauth.Middleware(v, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		gotBody, _ = io.ReadAll(r.Body)
		gotClaims, _ = hookauth.ClaimsFromContext(r.Context())
		rw.Write([]byte(`{"decision":"allow"}`))
	})))
	defer endpoint.Close()

	post := func(assertion string, b []byte) (int, map[string]string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint.URL+"/hooks/pre", bytes.NewReader(b))
		if assertion != "" {
			req.Header.Set(hookauth.HeaderName, assertion)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]string
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}

	jws := sign(t, w.signer)
	if status, out := post(jws, body); status != 200 || out["decision"] != "allow" {
		t.Fatalf("verified call: %d %v", status, out)
	}
	if !bytes.Equal(gotBody, body) || gotClaims == nil || gotClaims.Group != "security-gate" {
		t.Errorf("next saw body %q, claims %+v", gotBody, gotClaims)
	}

	for _, tc := range []struct {
		name      string
		assertion string
		body      []byte
		status    int
		code      string
	}{
		{"replayed", jws, body, 401, "replay"},
		{"no header", "", body, 401, "missing"},
		{"body changed", sign(t, w.signer), []byte(`{"tool_call":{}}`), 401, "body_mismatch"},
		{"garbage", "x.y.z", body, 401, "malformed"},
		{"oversized body", sign(t, w.signer), bytes.Repeat([]byte("a"), 2048), 413, "body_too_large"},
	} {
		gotBody = nil
		status, out := post(tc.assertion, tc.body)
		if status != tc.status || out["code"] != tc.code || out["decision"] != "deny" || out["error"] != "invalid_assertion" {
			t.Errorf("%s: %d %v, want %d with code %s", tc.name, status, out, tc.status, tc.code)
		}
		if gotBody != nil {
			t.Errorf("%s: next was called", tc.name)
		}
		if !strings.HasPrefix(out["reason"], "hookauth: ") {
			t.Errorf("%s: reason %q", tc.name, out["reason"])
		}
	}
}
