package vault

import (
	"errors"
	"testing"

	"github.com/egressd/egressd/internal/credential"
)

// TestVaultTypedShapes: the managed-agent platform's types, flat in a KV v2 secret whose
// path's last segment is the ID; "status": "revoked" is unavailable at once.
func TestVaultTypedShapes(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("goog", map[string]any{"type": "bearer_token", "token": planted, "header_name": "X-Goog-Api-Key", "prefix": ""})
	v.putKV("oa", map[string]any{"type": "oauth2", "client_id": "cid", "client_secret": planted,
		"refresh_token": planted, "token_url": "https://auth.test/token", "scopes": []any{"read"}})
	v.putKV("ev", map[string]any{"type": "environment_variable", "value": planted,
		"injection_location": []any{"header", "body"}, "trusted_domains": []any{"api.example.com"}})
	v.putKV("rev", map[string]any{"type": "bearer_token", "token": planted, "status": "revoked"})
	v.putKV("bad", map[string]any{"type": "bearer_token", "token": planted, "header_name": "Content-Length"})
	r := v.start(Options{Auth: NewTokenAuth("", v.childToken("1h"))}, credential.Options{}, "goog", "oa", "ev", "rev", "bad")
	if g, err := r.s.Get("goog"); err != nil || len(g.Headers) != 1 || g.Headers[0] != (credential.Header{Name: "X-Goog-Api-Key", Value: planted}) {
		t.Errorf("goog: %v %v", g, err)
	}
	if o, err := r.s.Get("oa"); err != nil || o.OAuth2 == nil || o.OAuth2.RefreshToken != planted || o.OAuth2.Scopes[0] != "read" {
		t.Errorf("oa: %v %v", o, err)
	}
	if e, err := r.s.Get("ev"); err != nil || e.Env == nil || e.Env.Value != planted || !e.Env.In("body") || !e.Env.Trusts("api.example.com") {
		t.Errorf("ev: %v %v", e, err)
	}
	var ue *credential.UnavailableError
	if _, err := r.s.Get("rev"); !errors.As(err, &ue) || ue.Cause != credential.CauseRevoked {
		t.Errorf("rev: %v, want cause revoked", err)
	}
	if _, err := r.s.Get("bad"); !errors.As(err, &ue) || ue.Cause != credential.CauseInvalid {
		t.Errorf("bad: %v, want cause invalid", err)
	}
	if r.count("rev", credential.ResultRevoked) == 0 {
		t.Error("no revoked result counted")
	}
}
