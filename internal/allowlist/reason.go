// Package allowlist decides whether a destination is on the environment's allowlist; it is pure: no I/O.
package allowlist

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// Reason is why a request was refused or failed; ReasonNone ("") means allowed.
// The string values are the stable codes of docs/reasons.md: they appear in logs,
// metrics and the Egressd-Reason header, so never rename them.
type Reason string

// Reasons. The eight after ReasonNone are policy denials; the rest are
// failures (see IsDenial). Reasons lists them all.
const (
	ReasonNone                Reason = ""
	ReasonBadRequest          Reason = "bad_request"
	ReasonNotAllowlisted      Reason = "not_allowlisted"
	ReasonPortNotAllowed      Reason = "port_not_allowed"
	ReasonInternalAddress     Reason = "internal_address"
	ReasonHostMismatch        Reason = "host_mismatch"
	ReasonPlaintextCredential Reason = "plaintext_credential"
	// ReasonMethodNotAllowed refuses TRACE and OPTIONS * to an entry that injects:
	// the upstream would reflect the injected values (405).
	ReasonMethodNotAllowed Reason = "method_not_allowed"
	// ReasonCredentialScope refuses a request carrying an environment_variable
	// credential's placeholder outside its trusted domains or injection locations (403).
	ReasonCredentialScope       Reason = "credential_scope"
	ReasonCredentialUnavailable Reason = "credential_unavailable"
	ReasonDNSFailure            Reason = "dns_failure"
	ReasonUpstreamUnreachable   Reason = "upstream_unreachable"
	ReasonUpstreamTLS           Reason = "upstream_tls"
	ReasonUpstreamTimeout       Reason = "upstream_timeout"
	// ReasonOverloaded answers connections beyond limits.max_connections (503).
	ReasonOverloaded Reason = "overloaded"
	// ReasonClientCancelled records a request whose client went away before it was
	// answered (a closed connection, an HTTP/2 RST_STREAM). Nothing is sent; it is
	// counted apart from upstream failures, which a client must not be able to fake.
	ReasonClientCancelled Reason = "client_cancelled"
)

// Reasons is every reason code, denials first, in docs/reasons.md's order: the one
// list that metrics exports from the start, that docs/reasons.md documents (its
// test checks the table against it) and that explain answers with.
var Reasons = []Reason{
	ReasonBadRequest, ReasonNotAllowlisted, ReasonPortNotAllowed, ReasonInternalAddress,
	ReasonHostMismatch, ReasonPlaintextCredential, ReasonMethodNotAllowed, ReasonCredentialScope,
	ReasonCredentialUnavailable, ReasonDNSFailure, ReasonUpstreamUnreachable, ReasonUpstreamTLS,
	ReasonUpstreamTimeout, ReasonOverloaded, ReasonClientCancelled,
}

// String returns the stable code, e.g. "not_allowlisted"; "" for ReasonNone.
func (r Reason) String() string { return string(r) }

// IsDenial reports whether r is a policy denial (the request was refused on
// purpose). Failures (dns_failure, upstream_*, credential_unavailable) and
// ReasonNone are not denials: denied and failed stay separate.
func (r Reason) IsDenial() bool {
	switch r {
	case ReasonBadRequest, ReasonNotAllowlisted, ReasonPortNotAllowed,
		ReasonInternalAddress, ReasonHostMismatch, ReasonPlaintextCredential, ReasonMethodNotAllowed,
		ReasonCredentialScope:
		return true
	}
	return false
}

// Message renders the one-sentence human explanation for the JSON response
// body. host and port name the destination (host is the normalised name, never
// a secret); env is the environment ID. detail is rendered only where it is a
// short code from this project's own vocabulary: the address class for
// internal_address and the cause for bad_request (e.g. "no_sni"). Details of
// failures (upstream errors, Vault paths) belong in the log, not here.
func (r Reason) Message(host string, port uint16, env, detail string) string {
	if host == "" {
		host = "the destination"
	}
	switch r {
	case ReasonNone:
		return ""
	case ReasonBadRequest:
		return withDetail("the request is malformed", detail)
	case ReasonNotAllowlisted:
		return notAllowlistedMessage(host, env)
	case ReasonPortNotAllowed:
		return fmt.Sprintf("port %d is not allowed for %s", port, host)
	case ReasonInternalAddress:
		return internalAddressMessage(host, detail)
	case ReasonHostMismatch:
		if detail == "port" {
			return fmt.Sprintf("the request's Host names another port than the connection's destination %s (only the port differs): send it without a port, or with this one", hostPort(host, port))
		}
	case ReasonCredentialScope:
		if detail == "github_token_revoke" {
			return fmt.Sprintf("the request to %s would revoke the installation token egressd injects, which every request of the credential shares; nothing was sent", host)
		}
		if m := awsScopeMessage(host, detail); m != "" {
			return m
		}
	case ReasonUpstreamUnreachable:
		if detail == "http2_only" {
			return fmt.Sprintf("%s accepts only HTTP/2; egressd now speaks HTTP/2 to it: retry the request (an HTTP/1.1 upgrade such as WebSocket cannot be carried)", hostPort(host, port))
		}
	}
	return r.failureMessage(host, port)
}

// failureMessage renders the reasons after the allowlist stage.
func (r Reason) failureMessage(host string, port uint16) string {
	switch r {
	case ReasonHostMismatch:
		return fmt.Sprintf("the request names a host other than the connection's destination %s", host)
	case ReasonPlaintextCredential:
		return fmt.Sprintf("refusing to send a credential to %s over plain HTTP; use https", host)
	case ReasonMethodNotAllowed:
		return fmt.Sprintf("TRACE and OPTIONS * are refused to %s: egressd injects into its requests, and the upstream would reflect the injected values", host)
	case ReasonCredentialScope:
		return fmt.Sprintf("the request to %s carries a credential placeholder that is not for %s (or not for that part of the request); nothing was sent", host, host)
	case ReasonCredentialUnavailable:
		return fmt.Sprintf("the credential for %s is currently unavailable", host)
	case ReasonDNSFailure:
		return fmt.Sprintf("%s could not be resolved", host)
	case ReasonUpstreamUnreachable:
		return fmt.Sprintf("could not connect to %s", hostPort(host, port))
	case ReasonUpstreamTLS:
		return fmt.Sprintf("could not establish a verified TLS connection to %s", host)
	case ReasonUpstreamTimeout:
		return fmt.Sprintf("%s did not respond in time", host)
	case ReasonOverloaded:
		return "egressd is at its connection limit; retry later"
	case ReasonClientCancelled:
		return "the client went away before the answer"
	}
	return fmt.Sprintf("request to %s refused (%s)", host, string(r))
}

func notAllowlistedMessage(host, env string) string {
	if env == "" {
		return host + " is not on the allowlist"
	}
	return fmt.Sprintf("%s is not on the allowlist of environment %s", host, env)
}

// internalAddressMessage words the sentence for an IP literal ("is") and a
// name ("resolves to") differently.
func internalAddressMessage(host, class string) string {
	verb := "resolves to"
	if _, err := netip.ParseAddr(host); err == nil {
		verb = "is"
	}
	return withDetail(fmt.Sprintf("%s %s a blocked address", host, verb), class)
}

func withDetail(msg, detail string) string {
	if detail == "" {
		return msg
	}
	return msg + " (" + detail + ")"
}

func hostPort(host string, port uint16) string {
	if port == 0 {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
