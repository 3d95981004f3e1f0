// Package hookauth verifies egressd's hook assertions; import it in a policy endpoint.
//
// egressd adds the header Egressd-Hook-Assertion to every hook call it forwards: a
// compact JWS (RFC 7515) with alg EdDSA, whose kid names a key of the JWKS egressd serves
// at /.well-known/jwks.json on its admin listener, over Claims. A Verifier checks one
// assertion against the body the endpoint received; Middleware does it for an
// http.Handler. egressd signs this package's Claims type, so the two cannot drift.
//
// Invariant: Verify returns claims only for an assertion that passed every check;
// anything else is an error wrapping one of the Err values below, and an endpoint that
// fails closed treats it as deny.
package hookauth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// The assertion's constants, as docs/hooks.md documents them for endpoints.
const (
	// HeaderName carries the assertion on a hook call.
	HeaderName = "Egressd-Hook-Assertion"
	// Issuer is the iss claim of every assertion.
	Issuer = "egressd"
	// Algorithm is the only JWS alg egressd signs with and Verify accepts.
	Algorithm = "EdDSA"
	// Lifetime is exp - iat of the assertions egressd signs.
	Lifetime = 60 * time.Second
)

// Values of Claims.Event.
const (
	EventPreTool  = "pre_tool_execution"
	EventPostTool = "post_tool_execution"
)

// Values of Claims.Ident: how egressd knew the call was hook traffic.
const (
	// IdentListener: the call came in on a listener with role hooks, which only the
	// agent runtime's hook client uses.
	IdentListener = "listener"
	// IdentRuntimeAuth: the call presented the runtime's own token
	// (hooks.runtime_auth) as Proxy-Authorization, which the sandbox never holds.
	IdentRuntimeAuth = "runtime_auth"
	// IdentURL: egressd matched the call by its URL alone (hooks.identify: url, or no
	// way to tell the runtime from the sandbox), so any sandbox traffic to the hook URL
	// is signed; the assertion proves egressd forwarded it, not that the runtime made it.
	IdentURL = "url"
)

// Claims are the assertion's payload.
type Claims struct {
	Issuer   string `json:"iss"` // always Issuer
	Audience string `json:"aud"` // the hook URL's origin (see Origin): one string, never a list
	Env      string `json:"env"` // egressd's environment ID
	Group    string `json:"group"`
	Event    string `json:"event"` // EventPreTool or EventPostTool
	// BodySHA256 is the lowercase hex SHA-256 of the body bytes as egressd sent them.
	BodySHA256 string `json:"body_sha256"`
	IssuedAt   int64  `json:"iat"` // Unix seconds
	Expiry     int64  `json:"exp"` // Unix seconds; IssuedAt + Lifetime
	ID         string `json:"jti"` // random, 128 bits, base64url; unique per assertion
	Ident      string `json:"ident"`
	// Sandbox is the node-mode sandbox whose listener the call arrived on; absent
	// from a sidecar's assertions, which serve one sandbox.
	Sandbox string `json:"sandbox,omitempty"`
}

// BodySHA256 returns the body_sha256 claim for body.
func BodySHA256(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Origin returns the audience egressd puts in the assertions of a hook URL:
// scheme://host[:port], scheme and host lower-cased, the scheme's default port omitted,
// an IPv6 host in brackets, no path, query or user info. Give an internationalised host
// in its punycode (xn--) form, as egressd does. Use it to set Options.Audience from the
// endpoint's own URL, as written in hooks.json.
func Origin(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	scheme := strings.ToLower(u.Scheme)
	if (scheme != "http" && scheme != "https") || u.Hostname() == "" {
		return "", fmt.Errorf("hookauth: %q is not an absolute http or https URL", rawURL)
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == defaultPort(scheme) {
		port = ""
	}
	if port == "" {
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		return scheme + "://" + host, nil
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}
