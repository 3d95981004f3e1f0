package explain

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/netguard"
)

const secret = "s3cr3t-transform-value"

func fixture(t *testing.T) (*allowlist.Policy, *netguard.Guard) {
	t.Helper()
	p, err := allowlist.Compile([]allowlist.Entry{
		{Domain: "api.example.com", Credential: "example-api",
			Transform: []allowlist.Header{{Name: "X-Key", Value: secret}}},
		{Domain: "*.github.com"},
		{Domain: "policy.example.com"},
		{Domain: "pypi.org", Ports: []uint16{443}},
	}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := netguard.New(netguard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p, g
}

func TestURL(t *testing.T) {
	p, g := fixture(t)
	star, _ := allowlist.Compile([]allowlist.Entry{{Domain: "*"}}, allowlist.Options{})
	cases := []struct {
		policy           *allowlist.Policy
		url              string
		decision, reason string
		detail, rule     string
		intercept        bool
	}{
		{p, "https://api.github.com/zen", "allow", "", "", "*.github.com", false},
		{p, "https://API.Example.com./v1", "allow", "", "", "api.example.com", true},
		{p, "http://api.example.com/v1", "deny", "plaintext_credential", "", "api.example.com", false},
		{p, "http://evil.test/", "deny", "not_allowlisted", "", "", false},
		{p, "http://pypi.org/simple", "deny", "port_not_allowed", "", "pypi.org", false},
		{p, "ftp://pypi.org/", "deny", "bad_request", "", "", false},
		{p, "http://user@api.github.com/", "deny", "bad_request", "", "", false},
		{star, "http://169.254.169.254/latest", "deny", "internal_address", "metadata", "*", false},
		{star, "http://0x7f.1/", "deny", "internal_address", "loopback", "*", false},
		{star, "http://[64:ff9b::a00:5]/", "deny", "internal_address", "private", "*", false},
	}
	for _, c := range cases {
		r := URL(c.policy, g, "env_demo", c.url)
		if r.Decision != c.decision || r.Reason != c.reason || r.Rule != c.rule || r.Intercept != c.intercept ||
			(c.detail != "" && r.Detail != c.detail) {
			t.Errorf("%s: got %s %q detail %q rule %q intercept %t", c.url, r.Decision, r.Reason, r.Detail, r.Rule, r.Intercept)
		}
	}
	r := URL(p, g, "env_demo", "https://api.example.com/")
	out, _ := json.Marshal(r)
	if strings.Contains(string(out), secret) {
		t.Error("explain output carries a header value")
	}
	if r.Credential != "example-api" || len(r.Inject) != 1 || r.Inject[0] != "X-Key" {
		t.Errorf("inject %v credential %q", r.Inject, r.Credential)
	}
}

func TestHook(t *testing.T) {
	p, g := fixture(t)
	f, err := hooks.Parse([]byte(`{"gate": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://policy.example.com/pre", "timeout": 5},
		{"type": "http", "url": "https://evil.test/pre"}]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	ix := hooks.NewIndex(f)
	r := Hook(URL(p, g, "env_demo", "https://policy.example.com/pre?x=1"), "https://policy.example.com/pre?x=1", ix, true)
	if r.Hook == nil || r.Hook.Event != hooks.EventPre || r.Hook.TimeoutSeconds != 5 || !r.Intercept || r.Decision != "allow" {
		t.Fatalf("allowed hook URL: %+v %+v", r, r.Hook)
	}
	r = Hook(URL(p, g, "env_demo", "https://evil.test/pre"), "https://evil.test/pre", ix, true)
	if r.Hook == nil || !strings.Contains(r.Hook.Answer, `"decision":"deny"`) || !strings.Contains(r.Hook.Answer, "not_allowlisted") {
		t.Fatalf("refused hook URL: %+v", r.Hook)
	}
	if r = Hook(URL(p, g, "env_demo", "https://api.github.com/x"), "https://api.github.com/x", ix, true); r.Hook != nil {
		t.Errorf("ordinary URL reported as a hook: %+v", r.Hook)
	}
}

// TestBadRequestDetailAsTheProxy: a URL the proxy refuses as bad_request is explained
// with the same detail (the proxy's TestBadRequests sends these as request lines).
func TestBadRequestDetailAsTheProxy(t *testing.T) {
	p, g := fixture(t)
	for url, detail := range map[string]string{
		"/":                              "not_proxy_request",
		"http://evil.test@allowed.test/": "userinfo",
		"ftp://allowed.test/":            "scheme",
		"http://[fe80::1%25eth0]/":       "host",
		"http://bad_name!.test/":         "bad_name",
		"http://[::1/":                   "malformed_request",
	} {
		r := URL(p, g, "env_demo", url)
		if r.Reason != "bad_request" || r.Detail != detail {
			t.Errorf("%s: %s detail %q, want bad_request detail %q", url, r.Reason, r.Detail, detail)
		}
	}
}
