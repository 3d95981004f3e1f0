package allowlist

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/rs/zerolog"
)

// Header is one header egressd injects: an entry's transform or a credential's
// (credential.Header is this type). Name is in http.CanonicalHeaderKey form.
// Value may be a secret: every rendering (fmt verbs, JSON, zerolog) shows the
// name only, so printing or logging a Rule, Decision or credential shows
// header names, never values.
type Header struct{ Name, Value string }

// redacted replaces a header value wherever a Header is rendered.
const redacted = "[redacted]"

// String renders "Name: [redacted]".
func (h Header) String() string { return h.Name + ": " + redacted }

// GoString renders the header for %#v, value redacted.
func (h Header) GoString() string {
	return fmt.Sprintf("allowlist.Header{Name:%q, Value:%q}", h.Name, redacted)
}

// Format implements fmt.Formatter so that no verb (%d, %x, %+v ...) can reach the value.
func (h Header) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		fmt.Fprint(f, h.GoString())
		return
	}
	fmt.Fprint(f, h.String())
}

// MarshalJSON renders {"name": ..., "value": "[redacted]"}.
func (h Header) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}{h.Name, redacted})
}

// MarshalZerologObject writes the header name only.
func (h Header) MarshalZerologObject(e *zerolog.Event) { e.Str("name", h.Name) }

// HopByHop are the connection-specific fields of RFC 9110 §7.6.1, plus the legacy
// Proxy-Connection and HTTP2-Settings (RFC 7540 §3.2.1), in canonical form. A proxy
// removes them (and the fields Connection names) before forwarding;
// Proxy-Authorization is for egressd, never for the upstream.
var HopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Http2-Settings",
}

// ReservedHeader says why the canonical header name cannot be injected, by an
// entry's transform or by a credential, or "" when it can: egressd's own
// Egressd-* namespace, hop-by-hop fields (Proxy-* by prefix), which would be
// stripped, and the fields that frame or route the message.
func ReservedHeader(name string) string {
	switch {
	case strings.HasPrefix(name, "Egressd-"):
		return "the Egressd- prefix is reserved for egressd"
	case strings.HasPrefix(name, "Proxy-"), slices.Contains(HopByHop, name):
		return "it is a hop-by-hop header that proxies strip"
	case name == "Host":
		return "egressd sets Host from the destination"
	case name == "Content-Length":
		return "it frames the message body"
	}
	return ""
}
