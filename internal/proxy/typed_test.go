package proxy_test

import (
	"net/http"
	"testing"
)

// TestBearerTokenTypedShape: a bearer_token with header_name and an empty prefix sets
// exactly that header, the bare token, with every client copy removed, and nothing else.
func TestBearerTokenTypedShape(t *testing.T) {
	w := newInjectWorld(t, worldOpts{credentials: map[string]string{
		"api": `{"type": "bearer_token", "token": "` + secretToken + `", "header_name": "X-Goog-Api-Key", "prefix": ""}`,
	}})
	req, _ := http.NewRequest("GET", "https://api.allowed.test/v1", nil)
	req.Header["X-Goog-Api-Key"] = []string{"client-one", "client-two"}
	req.Header["x-goog-api-key"] = []string{"lowercase-copy"}
	resp, err := w.interceptingClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := decodeEcho(t, resp)
	if k := got.Header.Values("X-Goog-Api-Key"); len(k) != 1 || k[0] != secretMark {
		t.Errorf("upstream X-Goog-Api-Key = %q, want exactly the bare token", k)
	}
	if a := got.Header.Values("Authorization"); len(a) != 0 {
		t.Errorf("upstream got Authorization %q", a)
	}
	w.assertSecretNotLogged()
}

// TestRevokedCredentialIs503 : "status": "revoked" refuses with credential_unavailable,
// detail revoked, and nothing reaches the upstream.
func TestRevokedCredentialIs503(t *testing.T) {
	w := newInjectWorld(t, worldOpts{credentials: map[string]string{
		"api": `{"type": "bearer_token", "token": "` + secretToken + `", "status": "revoked"}`,
	}})
	resp, err := w.interceptingClient().Get("https://api.allowed.test/v1")
	if err != nil {
		t.Fatal(err)
	}
	assertRefused(t, resp, 503, "credential_unavailable", "revoked")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream got %d requests", n)
	}
	w.assertSecretNotLogged()
}
