package allowlist

import "testing"

func TestReasonIsDenial(t *testing.T) {
	tests := []struct {
		r    Reason
		want bool
	}{
		{ReasonNone, false},
		{ReasonBadRequest, true},
		{ReasonNotAllowlisted, true},
		{ReasonPortNotAllowed, true},
		{ReasonInternalAddress, true},
		{ReasonHostMismatch, true},
		{ReasonPlaintextCredential, true},
		{ReasonMethodNotAllowed, true},
		{ReasonCredentialUnavailable, false},
		{ReasonDNSFailure, false},
		{ReasonUpstreamUnreachable, false},
		{ReasonUpstreamTLS, false},
		{ReasonUpstreamTimeout, false},
	}
	for _, tt := range tests {
		if got := tt.r.IsDenial(); got != tt.want {
			t.Errorf("%q.IsDenial() = %v; want %v", tt.r, got, tt.want)
		}
	}
}

// The codes are a public contract (docs/reasons.md): logs, metrics, headers.
func TestReasonCodes(t *testing.T) {
	codes := map[Reason]string{
		ReasonBadRequest: "bad_request", ReasonNotAllowlisted: "not_allowlisted",
		ReasonPortNotAllowed: "port_not_allowed", ReasonInternalAddress: "internal_address",
		ReasonHostMismatch: "host_mismatch", ReasonPlaintextCredential: "plaintext_credential",
		ReasonCredentialUnavailable: "credential_unavailable", ReasonDNSFailure: "dns_failure",
		ReasonUpstreamUnreachable: "upstream_unreachable", ReasonUpstreamTLS: "upstream_tls",
		ReasonUpstreamTimeout: "upstream_timeout", ReasonMethodNotAllowed: "method_not_allowed", ReasonNone: "",
	}
	for r, want := range codes {
		if r.String() != want {
			t.Errorf("String() = %q; want %q", r.String(), want)
		}
	}
}

func TestReasonMessage(t *testing.T) {
	tests := []struct {
		r      Reason
		host   string
		port   uint16
		env    string
		detail string
		want   string
	}{
		{ReasonNone, "pypi.org", 443, "env_demo", "", ""},
		{ReasonNotAllowlisted, "evil.test", 443, "env_demo", "", "evil.test is not on the allowlist of environment env_demo"},
		{ReasonNotAllowlisted, "evil.test", 443, "", "", "evil.test is not on the allowlist"},
		{ReasonPortNotAllowed, "pypi.org", 8080, "env_demo", "", "port 8080 is not allowed for pypi.org"},
		{ReasonInternalAddress, "pypi.org", 443, "env_demo", "private", "pypi.org resolves to a blocked address (private)"},
		{ReasonInternalAddress, "127.0.0.1", 80, "env_demo", "loopback", "127.0.0.1 is a blocked address (loopback)"},
		{ReasonBadRequest, "", 0, "env_demo", "no_sni", "the request is malformed (no_sni)"},
		{ReasonBadRequest, "", 0, "env_demo", "", "the request is malformed"},
		{ReasonHostMismatch, "a.test", 443, "env_demo", "sni", "the request names a host other than the connection's destination a.test"},
		{ReasonHostMismatch, "a.test", 443, "env_demo", "port", "the request's Host names another port than the connection's destination a.test:443 (only the port differs): send it without a port, or with this one"},
		{ReasonPlaintextCredential, "api.test", 80, "env_demo", "", "refusing to send a credential to api.test over plain HTTP; use https"},
		{ReasonMethodNotAllowed, "api.test", 443, "env_demo", "trace", "TRACE and OPTIONS * are refused to api.test: egressd injects into its requests, and the upstream would reflect the injected values"},
		{ReasonCredentialScope, "api.github.com", 443, "env_demo", "github_token_revoke", "the request to api.github.com would revoke the installation token egressd injects, which every request of the credential shares; nothing was sent"},
		{ReasonCredentialScope, "api.test", 443, "env_demo", "header", "the request to api.test carries a credential placeholder that is not for api.test (or not for that part of the request); nothing was sent"},
		{ReasonCredentialUnavailable, "api.test", 443, "env_demo", "secret/data/x: 403", "the credential for api.test is currently unavailable"},
		{ReasonDNSFailure, "nx.test", 443, "env_demo", "", "nx.test could not be resolved"},
		{ReasonUpstreamUnreachable, "::1", 443, "env_demo", "", "could not connect to [::1]:443"},
		{ReasonUpstreamTLS, "a.test", 443, "env_demo", "x509: unknown authority", "could not establish a verified TLS connection to a.test"},
		{ReasonUpstreamTimeout, "slow.test", 443, "env_demo", "", "slow.test did not respond in time"},
	}
	for _, tt := range tests {
		if got := tt.r.Message(tt.host, tt.port, tt.env, tt.detail); got != tt.want {
			t.Errorf("%q.Message() = %q; want %q", tt.r, got, tt.want)
		}
	}
}
