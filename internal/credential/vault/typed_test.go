package vault

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
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

// TestVaultWriteBackIsANewKVVersion: a rotated refresh token is written as a new KV
// version of the same path (check-and-set on the version read); a stale version is refused.
func TestVaultWriteBackIsANewKVVersion(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	secret := map[string]any{"type": "oauth2", "client_id": "cid", "client_secret": planted,
		"refresh_token": planted + "-1", "token_url": "https://auth.test/token"}
	v.putKV("oa", secret)
	pol := v.policy(fmt.Sprintf("path \"secret/data/%s/*\" { capabilities = [\"create\", \"update\", \"read\"] }", v.prefix()))
	tok := v.write("auth/token/create", map[string]any{"policies": []string{pol}, "ttl": "1h"}).Auth.ClientToken
	r := v.start(Options{Auth: NewTokenAuth("", writeFile(t, "token", tok))}, credential.Options{}, "oa")
	cur, err := r.s.Get("oa")
	if err != nil || cur.Version != "1" {
		t.Fatalf("oa: %v %v", cur, err)
	}
	next := maps.Clone(cur.OAuth2.Raw)
	next["refresh_token"] = planted + "-2"
	if err := r.b.Write(context.Background(), "oa", cur.Version, next); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := v.read("secret/data/" + v.prefix() + "/oa")
	data, _ := got.Data["data"].(map[string]any)
	meta, _ := got.Data["metadata"].(map[string]any)
	if data["refresh_token"] != planted+"-2" || data["client_secret"] != planted || fmt.Sprint(meta["version"]) != "2" {
		t.Errorf("KV after the write-back: version %v", meta["version"])
	}
	err = r.b.Write(context.Background(), "oa", "1", next)
	if err == nil || strings.Contains(err.Error(), planted) {
		t.Errorf("write with a stale version: %v, want a refusal without the secret", err)
	}
}
