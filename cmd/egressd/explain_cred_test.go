package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/explain"
)

// explainSecret is a credential value: explain may name its headers, never print it.
const explainSecret = "explain-cli-secret-value"

// TestExplainCredentialHeaders: for an entry that names a credential, explain lists
// the header names the credential sets (read from the credentials file), merged
// with the transform's; for an ID the file lacks, or a Vault backend (not contacted
// offline), it names the credential and says its headers are unknown. No output
// ever holds a value.
func TestExplainCredentialHeaders(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{"api": {"headers": {"X-Api-Key": "` + explainSecret + `"}},
			"basic": {"username": "u", "password": "` + explainSecret + `"},
			"env": {"type": "environment_variable", "value": "` + explainSecret + `", "injection_location": "header"}}`,
		"environment.json": `{"network": {"allowlist": [
			{"domain": "api.example.com", "credential": "api", "transform": {"X-Trace": "` + explainSecret + `"}},
			{"domain": "basic.example.com", "credential": "basic"},
			{"domain": "env.example.com", "credential": "env"},
			{"domain": "gone.example.com", "credential": "gone"}]}}`,
	})
	vaultDir := writeFiles(t, map[string]string{
		"egressd.yaml": `version: 1
listeners: [{name: sandbox, address: 127.0.0.1:15001}]
policy: {file: environment.json}
credentials: {backend: vault, vault: {address: "http://127.0.0.1:1", auth: {method: token, token_file: token}}}
`,
		"environment.json": `{"network": {"allowlist": [{"domain": "api.example.com", "credential": "api"}]}}`,
		"token":            explainSecret,
	})
	for _, tc := range []struct {
		cfg, url, inject, textCred string
		unknown                    string // a piece of credential_headers_unknown; "" when known
	}{
		{dir, "https://api.example.com/", "X-Trace, X-Api-Key", "api", ""},
		{dir, "https://basic.example.com/", "Authorization", "basic", ""},
		{dir, "https://env.example.com/", "(none)", "env", ""},
		{dir, "https://gone.example.com/", "(none)", "gone", "not found"},
		{vaultDir, "https://api.example.com/", "(none)", "api", "not read offline"},
	} {
		cfg := filepath.Join(tc.cfg, "egressd.yaml")
		res := egressd(t, "explain", "--config", cfg, tc.url)
		f := explainText(t, res)
		if res.code != 0 || f["inject"] != tc.inject || f["credential"] != tc.textCred ||
			!strings.Contains(f["credential headers"], tc.unknown) || (tc.unknown == "") != (f["credential headers"] == "") {
			t.Errorf("explain %s: %s\nwant inject %q, credential %q, unknown %q", tc.url, res, tc.inject, tc.textCred, tc.unknown)
		}
		jres := egressd(t, "explain", "--config", cfg, "--format", "json", tc.url)
		var got explain.Result
		if err := json.Unmarshal([]byte(jres.stdout), &got); err != nil {
			t.Fatalf("explain --format json: %v\n%s", err, jres)
		}
		if want := strings.ReplaceAll(strings.TrimSuffix(tc.inject, "(none)"), ", ", ","); strings.Join(got.Inject, ",") != want {
			t.Errorf("explain --format json %s: inject %q, want %q", tc.url, got.Inject, want)
		}
		for _, out := range []string{res.all(), jres.all()} {
			if strings.Contains(out, explainSecret) {
				t.Errorf("explain %s printed a secret value:\n%s", tc.url, out)
			}
		}
	}
}

// TestExplainBadName: explain refuses a host that is not a DNS name as the proxy does,
// bad_request with detail bad_name, and says why.
func TestExplainBadName(t *testing.T) {
	for _, u := range []string{"https://-a.github.com/", "https://a-.github.com/", "https://a..github.com/"} {
		res := egressd(t, "explain", "--config", quickstart, "--format", "json", u)
		var got explain.Result
		if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
			t.Fatalf("explain %s: %v\n%s", u, err, res)
		}
		if res.code != 0 || got.Decision != "deny" || got.Reason != "bad_request" || got.Detail != "bad_name" || got.Note == "" {
			t.Errorf("explain %s: %s\nwant deny, bad_request, detail bad_name and a note", u, res)
		}
	}
}

// TestExplainPlaceholder: for a trusted domain of an environment_variable credential,
// explain says what the proxy does: it intercepts the host (under intercept: auto,
// although the entry injects nothing) and replaces the placeholder the sandbox holds
// (named by its variable) in the credential's locations; another host is spliced and
// gets no replacement. The value is never printed.
func TestExplainPlaceholder(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{"search": {"type": "environment_variable", "value": "` + explainSecret + `",
			"injection_location": ["header", "query"], "trusted_domains": ["api.search.example"]}}`,
		"environment.json": `{"network": {"allowlist": [{"domain": "api.search.example"}, {"domain": "other.example"}]},
			"env": {"SEARCH_API_KEY": {"credential": "search"}}}`,
	})
	cfg := filepath.Join(dir, "egressd.yaml")
	for _, tc := range []struct {
		url, intercept, placeholder string
	}{
		{"https://api.search.example/v1", "true", "SEARCH_API_KEY (credential search) replaced in header, query"},
		{"https://other.example/", "false", ""},
	} {
		res := egressd(t, "explain", "--config", cfg, tc.url)
		f := explainText(t, res)
		if res.code != 0 || f["intercept"] != tc.intercept || f["placeholder"] != tc.placeholder {
			t.Errorf("explain %s: %s\nwant intercept %s, placeholder %q", tc.url, res, tc.intercept, tc.placeholder)
		}
		jres := egressd(t, "explain", "--config", cfg, "--format", "json", tc.url)
		var got explain.Result
		if err := json.Unmarshal([]byte(jres.stdout), &got); err != nil {
			t.Fatalf("explain --format json: %v\n%s", err, jres)
		}
		if (tc.placeholder != "") != (len(got.Placeholders) == 1 && got.Intercept) {
			t.Errorf("explain --format json %s: intercept %t, placeholders %+v", tc.url, got.Intercept, got.Placeholders)
		}
		for _, out := range []string{res.all(), jres.all()} {
			if strings.Contains(out, explainSecret) {
				t.Errorf("explain %s printed a secret value:\n%s", tc.url, out)
			}
		}
	}
}
