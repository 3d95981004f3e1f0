// Package credential resolves credential IDs to the headers they inject, from a backend,
// serving the last good value from memory.
//
// Invariant: a secret never leaves this package in printable form. Header and Value redact
// themselves in every rendering (fmt verbs, JSON, zerolog); errors name credential IDs,
// header names and cause classes, never values. Requests are answered from memory only:
// backend reads happen at Start and in the background, never on the request path.
package credential

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/rs/zerolog"
)

// Header is one header a credential sets: allowlist.Header, whose Value is secret and
// which prints as "Name: [redacted]" in every fmt verb, JSON and zerolog.
type Header = allowlist.Header

// Value is a credential's current secret, as headers. It redacts itself everywhere it
// could be printed: String, GoString, Format, MarshalJSON and MarshalZerologObject show
// the ID, version and header names only.
//
// Headers is shared by every copy of the Value handed out by a Store: callers must
// not modify the slice or its elements.
//
// fmt cannot call methods on unexported struct fields: a struct that keeps a Value or
// Header in an unexported field and is itself printed with %v shows the secret. Log the
// Value (or its ID and Version), never a struct that holds one.
type Value struct {
	ID      string
	Version string    // backend version (file: sha256 prefix of the secret's canonical JSON; Vault: KV version)
	Type    string    // "" for egressd's own shapes, else TypeBearerToken, TypeOAuth2 or TypeEnvironmentVariable
	Headers []Header  // derived from the secret's shape by Parse; for oauth2, set by the token manager
	OAuth2  *OAuth2   // type oauth2: the client (redacts itself)
	Env     *EnvVar   // type environment_variable: the value (redacts itself)
	AWS     *AWS      // type aws: the keys (redact themselves); for vault_aws, set by the aws token manager
	ReadAt  time.Time // last successful read of this credential

	// GitHubApp: type github_app, the installation (redacts itself); Headers are set by
	// the token manager.
	GitHubApp *GitHubApp
}

// Names returns the names of the headers the credential sets, in order.
func (v Value) Names() []string {
	names := make([]string, len(v.Headers))
	for i, h := range v.Headers {
		names[i] = h.Name
	}
	return names
}

// Token returns the bare token of a {"token": ...} secret (its one header is
// "Authorization: Bearer <token>"; a {"headers": ...} secret with only that header gives its
// token too), and false otherwise. A token may be a PEM
// block, line breaks included: that is how egressd reads its hook signing key through the
// Store. The result is the secret itself: never log it.
func (v Value) Token() (string, bool) {
	if len(v.Headers) != 1 || v.Headers[0].Name != "Authorization" {
		return "", false
	}
	tok, ok := strings.CutPrefix(v.Headers[0].Value, "Bearer ")
	if !ok {
		return "", false
	}
	return tok, true
}

// String shows the ID, version and header names, e.g.
// "credential example-api version 3f2a… headers [Authorization]".
func (v Value) String() string {
	return "credential " + v.ID + " version " + v.Version + " headers [" + strings.Join(v.Names(), " ") + "]"
}

// GoString is the redacted %#v rendering.
func (v Value) GoString() string {
	return fmt.Sprintf("credential.Value{ID:%q, Version:%q, Headers:%#v, ReadAt:%s}",
		v.ID, v.Version, v.Names(), v.ReadAt.Format(time.RFC3339Nano))
}

// Format implements fmt.Formatter so that no verb (%d, %x, %+v ...) can reach a value.
func (v Value) Format(f fmt.State, verb rune) { format(f, verb, v.String(), v.GoString()) }

// MarshalJSON writes the ID, version, header names and read time.
func (v Value) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID      string    `json:"id"`
		Version string    `json:"version"`
		Headers []string  `json:"headers"`
		ReadAt  time.Time `json:"read_at"`
	}{v.ID, v.Version, v.Names(), v.ReadAt})
}

// MarshalZerologObject writes the ID, version, header names and read time.
func (v Value) MarshalZerologObject(e *zerolog.Event) {
	e.Str("id", v.ID).Str("version", v.Version).Strs("headers", v.Names()).Time("read_at", v.ReadAt)
}

// format renders a secret-holding type: %#v gets goString, every other verb the
// redacted string (so %x or %q show the redacted text, not the secret).
func format(f fmt.State, verb rune, s, goString string) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, goString)
		return
	}
	fmt.Fprint(f, s)
}
