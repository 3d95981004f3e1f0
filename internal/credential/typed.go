package credential

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
)

// The managed-agent platform's credential types: the "type" field of a typed secret.
const (
	TypeBearerToken         = "bearer_token"
	TypeOAuth2              = "oauth2"
	TypeEnvironmentVariable = "environment_variable"
)

// Defaults of a bearer_token secret.
const (
	DefaultBearerHeader = "Authorization" // header_name when absent
	DefaultBearerPrefix = "Bearer"        // prefix when absent; "" means the bare token
)

// Values of a typed secret's "status". Anything but "revoked" is served.
const (
	StatusActive  = "active"
	StatusRevoked = "revoked"
)

// Injection locations of an environment_variable secret.
const (
	LocationHeader = "header"
	LocationQuery  = "query"
	LocationBody   = "body"
)

// ErrRevoked is wrapped by the error of a secret whose status is "revoked": the backend
// answered and the security team revoked it, so the Store makes it unavailable at once.
var ErrRevoked = errors.New("credential revoked")

// Secret is one credential as a backend read it: static headers (egressd's own shapes and
// bearer_token), or an oauth2 client, or an environment_variable value. Exactly one of
// Headers, OAuth2 and Env is set.
type Secret struct {
	Type    string   // "" for egressd's own shapes, else one of the Type* constants
	Headers []Header // the headers set, for every type but oauth2 and environment_variable
	OAuth2  *OAuth2  // type oauth2: the headers come from its token endpoint
	Env     *EnvVar  // type environment_variable: no headers; placeholders are replaced
	// GitHubApp: type github_app; the headers come from the installation tokens minted
	GitHubApp *GitHubApp
	// AWS: type aws: no headers; requests are signed again (SigV4)
	AWS *AWS
}

// empty reports whether the secret sets nothing at all.
func (s Secret) empty() bool {
	return len(s.Headers) == 0 && s.OAuth2 == nil && s.Env == nil && s.GitHubApp == nil && s.AWS == nil
}

// OAuth2 is an oauth2 client. ClientSecret and RefreshToken are secrets: OAuth2 redacts
// itself in every rendering, like Header.
type OAuth2 struct {
	ClientID     string
	ClientSecret string // may be "" (a public client)
	RefreshToken string // "" means the client-credentials grant (RFC 6749 §4.4)
	TokenURL     string // https
	Scopes       []string
	// Raw is the secret as stored, for writing a rotated refresh token back with every
	// other field unchanged. It holds the secrets too.
	Raw map[string]any
}

// String shows the client ID, token URL and grant, never a secret.
func (o *OAuth2) String() string {
	grant := "refresh_token"
	if o.RefreshToken == "" {
		grant = "client_credentials"
	}
	return "oauth2 client " + o.ClientID + " at " + o.TokenURL + " (" + grant + ")"
}

// GoString is String for %#v.
func (o *OAuth2) GoString() string { return "&credential.OAuth2{" + o.String() + "}" }

// Format implements fmt.Formatter so that no verb reaches a secret.
func (o *OAuth2) Format(f fmt.State, verb rune) { format(f, verb, o.String(), o.GoString()) }

// MarshalJSON writes the client ID, token URL and scopes.
func (o *OAuth2) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ClientID string   `json:"client_id"`
		TokenURL string   `json:"token_url"`
		Scopes   []string `json:"scopes"`
	}{o.ClientID, o.TokenURL, o.Scopes})
}

// MarshalZerologObject writes the client ID and token URL.
func (o *OAuth2) MarshalZerologObject(e *zerolog.Event) {
	e.Str("client_id", o.ClientID).Str("token_url", o.TokenURL)
}

// EnvVar is an environment_variable credential. Value is secret: EnvVar redacts itself in
// every rendering.
type EnvVar struct {
	Value          string
	Locations      []string // LocationHeader, LocationQuery, LocationBody; sorted, at least one
	TrustedDomains []string // normalised patterns; empty: the hosts whose winning entry names it
}

// In reports whether loc is one of the named injection locations.
func (e *EnvVar) In(loc string) bool { return slices.Contains(e.Locations, loc) }

// Trusts reports whether the normalised host is one of the trusted domains.
func (e *EnvVar) Trusts(host string) bool {
	return slices.ContainsFunc(e.TrustedDomains, func(p string) bool { return allowlist.MatchPattern(p, host) })
}

// String shows the locations and trusted domains, never the value.
func (e *EnvVar) String() string {
	return "environment_variable in [" + strings.Join(e.Locations, " ") + "] for [" + strings.Join(e.TrustedDomains, " ") + "]"
}

// GoString is String for %#v.
func (e *EnvVar) GoString() string { return "&credential.EnvVar{" + e.String() + "}" }

// Format implements fmt.Formatter so that no verb reaches the value.
func (e *EnvVar) Format(f fmt.State, verb rune) { format(f, verb, e.String(), e.GoString()) }

// MarshalJSON writes the locations and trusted domains.
func (e *EnvVar) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Locations      []string `json:"injection_location"`
		TrustedDomains []string `json:"trusted_domains"`
	}{e.Locations, e.TrustedDomains})
}

// MarshalZerologObject writes the locations and trusted domains.
func (e *EnvVar) MarshalZerologObject(ev *zerolog.Event) {
	ev.Strs("injection_location", e.Locations).Strs("trusted_domains", e.TrustedDomains)
}

// Parse turns a secret of any shape into what it sets: egressd's own three shapes
// (ParseSecret) or a typed one ({"type": ...}, flat). A secret of any shape with
// "status": "revoked" gives an error wrapping ErrRevoked. Errors wrap ErrInvalid (or
// ErrRevoked), name the ID, the field and the fix, never a value.
func Parse(id string, raw map[string]any) (Secret, error) {
	if err := checkStatus(id, raw); err != nil {
		return Secret{}, err
	}
	t, typed := raw["type"]
	if !typed {
		if _, ok := raw["status"]; ok {
			raw = maps.Clone(raw)
			delete(raw, "status")
		}
		hs, err := ParseSecret(id, raw)
		return Secret{Headers: hs}, err
	}
	ts, _ := t.(string)
	switch ts {
	case TypeBearerToken:
		return parseBearer(id, raw)
	case TypeOAuth2:
		return parseOAuth2(id, raw)
	case TypeEnvironmentVariable:
		return parseEnvVar(id, raw)
	case TypeGitHubApp:
		return parseGitHubApp(id, raw)
	case TypeAWS:
		return parseAWS(id, raw)
	}
	return Secret{}, valueErr(id, `"type": `+typeName(t)+` is not a credential type; use "bearer_token", "oauth2", "environment_variable", "github_app" or "aws" (or drop "type" for egressd's own shapes)`)
}

func typeName(t any) string {
	if s, ok := t.(string); ok {
		return quoteName(s)
	}
	return "(not a string)"
}

// checkStatus returns ErrRevoked for "status": "revoked", nil for none or "active".
func checkStatus(id string, raw map[string]any) error {
	v, ok := raw["status"]
	if !ok {
		return nil
	}
	switch s, _ := v.(string); s {
	case StatusActive:
		return nil
	case StatusRevoked:
		return fmt.Errorf("credential %s: status is %q: %w", id, StatusRevoked, ErrRevoked)
	}
	return valueErr(id, `"status" must be "active" or "revoked"`)
}

// typedFields checks that raw holds only the given keys (besides type and status) and that
// the required ones are non-empty strings.
func typedFields(id, typ string, raw map[string]any, allowed, required []string) error {
	var unknown []string
	for k := range raw {
		if k != "type" && k != "status" && !slices.Contains(allowed, k) {
			unknown = append(unknown, quoteName(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return valueErr(id, typ+": unknown key "+strings.Join(unknown, ", ")+"; the fields are "+strings.Join(allowed, ", "))
	}
	for _, k := range required {
		if s, ok := raw[k].(string); !ok || s == "" {
			return valueErr(id, typ+": "+quoteName(k)+" is required (a non-empty string)")
		}
	}
	return nil
}

// optString returns raw[k] as a string, def when absent, or an error naming k.
func optString(id, typ string, raw map[string]any, k, def string) (string, error) {
	v, ok := raw[k]
	if !ok {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", valueErr(id, typ+": "+quoteName(k)+" must be a string")
	}
	return s, nil
}

func parseBearer(id string, raw map[string]any) (Secret, error) {
	const typ = TypeBearerToken
	if err := typedFields(id, typ, raw, []string{"token", "header_name", "prefix"}, []string{"token"}); err != nil {
		return Secret{}, err
	}
	name, err := optString(id, typ, raw, "header_name", DefaultBearerHeader)
	if err != nil {
		return Secret{}, err
	}
	prefix, err := optString(id, typ, raw, "prefix", DefaultBearerPrefix)
	if err != nil {
		return Secret{}, err
	}
	canon := http.CanonicalHeaderKey(name)
	switch {
	case !validName(name):
		return Secret{}, valueErr(id, typ+": header_name "+quoteName(name)+" is not a valid header name (e.g. \"X-Api-Key\")")
	case allowlist.ReservedHeader(canon) != "":
		return Secret{}, valueErr(id, typ+": header_name "+quoteName(canon)+" cannot be injected (hop-by-hop, framing or Egressd-* header); use another header")
	case strings.ContainsAny(prefix, " \t") || hasControl(prefix):
		return Secret{}, valueErr(id, typ+`: prefix must be one word such as "Bearer" or "token" (egressd adds the space), or "" for the bare token`)
	}
	tok := raw["token"].(string)
	if what := checkValue(tok); what != "" {
		return Secret{}, valueErr(id, typ+": token "+what)
	}
	if prefix != "" && len(tok) > len(prefix) && strings.EqualFold(tok[:len(prefix)+1], prefix+" ") {
		return Secret{}, valueErr(id, typ+": token starts with the prefix: give the bare token, egressd adds the prefix")
	}
	v := tok
	if prefix != "" {
		v = prefix + " " + tok
	}
	return Secret{Type: typ, Headers: []Header{{Name: canon, Value: v}}}, nil
}

func parseOAuth2(id string, raw map[string]any) (Secret, error) {
	const typ = TypeOAuth2
	fields := []string{"client_id", "client_secret", "refresh_token", "token_url", "scopes"}
	if err := typedFields(id, typ, raw, fields, []string{"client_id", "token_url"}); err != nil {
		return Secret{}, err
	}
	o := &OAuth2{ClientID: raw["client_id"].(string), TokenURL: raw["token_url"].(string), Raw: raw}
	var err error
	if o.ClientSecret, err = optString(id, typ, raw, "client_secret", ""); err != nil {
		return Secret{}, err
	}
	if o.RefreshToken, err = optString(id, typ, raw, "refresh_token", ""); err != nil {
		return Secret{}, err
	}
	if o.RefreshToken == "" && o.ClientSecret == "" {
		return Secret{}, valueErr(id, typ+`: give "refresh_token" (refresh-token grant) or "client_secret" (client-credentials grant)`)
	}
	if u, err := url.Parse(o.TokenURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return Secret{}, valueErr(id, typ+`: "token_url" must be an https:// URL without user info, e.g. "https://auth.example.com/oauth/token"`)
	}
	if hasControl(o.ClientID) {
		return Secret{}, valueErr(id, typ+`: "client_id" contains a control character`)
	}
	if o.Scopes, err = stringList(id, typ, raw, "scopes"); err != nil {
		return Secret{}, err
	}
	return Secret{Type: typ, OAuth2: o}, nil
}

// stringList reads raw[k] as a list of non-empty strings; a lone string is a list of one.
func stringList(id, typ string, raw map[string]any, k string) ([]string, error) {
	switch v := raw[k].(type) {
	case nil:
		return nil, nil
	case string:
		if v != "" {
			return []string{v}, nil
		}
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, ok := x.(string)
			if !ok || s == "" {
				return nil, valueErr(id, typ+": "+quoteName(k)+" must be a list of non-empty strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, valueErr(id, typ+": "+quoteName(k)+" must be a list of non-empty strings")
}

func parseEnvVar(id string, raw map[string]any) (Secret, error) {
	const typ = TypeEnvironmentVariable
	fields := []string{"value", "injection_location", "trusted_domains"}
	if err := typedFields(id, typ, raw, fields, []string{"value"}); err != nil {
		return Secret{}, err
	}
	e := &EnvVar{Value: raw["value"].(string)}
	if hasControl(e.Value) {
		return Secret{}, valueErr(id, typ+`: "value" contains a control character (CR, LF, NUL ...)`)
	}
	locs, err := stringList(id, typ, raw, "injection_location")
	if err != nil {
		return Secret{}, err
	}
	if len(locs) == 0 {
		return Secret{}, valueErr(id, typ+`: "injection_location" is required: "header", "query", "body" or a list of them`)
	}
	for _, l := range locs {
		if l != LocationHeader && l != LocationQuery && l != LocationBody {
			return Secret{}, valueErr(id, typ+`: "injection_location" `+quoteName(l)+` is not "header", "query" or "body"`)
		}
	}
	slices.Sort(locs)
	e.Locations = slices.Compact(locs)
	doms, err := stringList(id, typ, raw, "trusted_domains")
	if err != nil {
		return Secret{}, err
	}
	for i, d := range doms {
		p, err := allowlist.ParsePattern(d)
		if err != nil {
			return Secret{}, valueErr(id, fmt.Sprintf("%s: trusted_domains[%d]: %s", typ, i, err))
		}
		e.TrustedDomains = append(e.TrustedDomains, p)
	}
	return Secret{Type: typ, Env: e}, nil
}
