// Package explain computes, offline, the decision egressd would make for a URL: the
// same allowlist and address guard as the proxy, with no DNS and no connection.
package explain

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/netguard"
)

// Result is what explain reports. It names headers and credential IDs, never values.
type Result struct {
	URL        string   `json:"url"`
	Scheme     string   `json:"scheme"`
	Host       string   `json:"host"`
	Port       uint16   `json:"port"`
	Decision   string   `json:"decision"` // allow | deny
	Reason     string   `json:"reason"`
	Detail     string   `json:"detail,omitempty"`
	Message    string   `json:"message"`
	Rule       string   `json:"rule"`
	Intercept  bool     `json:"intercept"`
	Inject     []string `json:"inject"`     // header names that would be set: the transform's and the credential's
	Credential string   `json:"credential"` // credential ID whose headers would be set
	// CredentialHeaders are the header names the credential sets, from the
	// credential backend; CredentialUnknown says why they are not known instead.
	CredentialHeaders []string  `json:"credential_headers,omitempty"`
	CredentialUnknown string    `json:"credential_headers_unknown,omitempty"`
	Note              string    `json:"note,omitempty"`
	Hook              *HookInfo `json:"hook,omitempty"`
	// Placeholders are the environment_variable credentials whose placeholders
	// egressd replaces in requests to this host.
	Placeholders []Placeholder `json:"placeholders,omitempty"`
	// AWS is the entry's aws block: what an aws credential signs requests for.
	AWS *allowlist.AWSScope `json:"aws,omitempty"`
}

// Placeholder is an environment_variable credential whose placeholder egressd
// replaces with its value in requests to the explained host. Never the value.
type Placeholder struct {
	Credential string   `json:"credential"`
	Variables  []string `json:"variables"` // the sandbox's variables holding the placeholder (env section)
	Locations  []string `json:"locations"` // where it is replaced: header, query, body
}

// URL explains raw against policy p and guard g for environment env.
func URL(p *allowlist.Policy, g *netguard.Guard, env, raw string) Result {
	res := Result{URL: raw, Inject: []string{}}
	u, err := url.Parse(raw)
	if err != nil {
		// What the proxy answers a request line whose target does not parse.
		res = res.deny(env, allowlist.ReasonBadRequest, "malformed_request")
		res.Note = err.Error()
		return res
	}
	t, err := allowlist.URLTarget(u)
	res.Scheme, res.Host, res.Port = u.Scheme, t.Host, t.Port
	if err != nil {
		// The proxy's detail for the same URL; the note says what is wrong with it.
		res = res.deny(env, allowlist.ReasonBadRequest, allowlist.URLTargetDetail(err))
		res.Note = err.Error()
		return res
	}
	d := p.DecideRequest(t, u.Scheme)
	res.Rule, res.Intercept = d.RuleName(), d.Intercept
	if d.Rule != nil && d.Allowed() {
		for _, h := range d.Rule.Transform {
			res.Inject = addName(res.Inject, h.Name)
		}
		res.Credential, res.AWS = d.Rule.Credential, d.Rule.AWS
	}
	if !d.Allowed() {
		return res.deny(env, d.Reason, d.Detail)
	}
	if t.IsIP() {
		if err := g.Check(netip.AddrPortFrom(t.Addr, t.Port)); err != nil {
			return res.deny(env, allowlist.ReasonInternalAddress, string(netguard.Classify(t.Addr)))
		}
	} else {
		res.Note = "offline: the name was not resolved; every address it resolves to is checked when it is used"
	}
	res.Decision = "allow"
	res.Message = fmt.Sprintf("%s is allowed by rule %q", t, res.Rule)
	return res
}

func (r Result) deny(env string, reason allowlist.Reason, detail string) Result {
	r.Decision, r.Reason, r.Detail = "deny", string(reason), detail
	r.Message = reason.Message(r.Host, r.Port, env, detail)
	r.Inject, r.Credential, r.Intercept, r.AWS = []string{}, "", false, nil
	return r
}

// HeaderNames returns the names of the headers credential id sets, or an error when
// the credential backend cannot say. It must never return or wrap a value.
type HeaderNames func(id string) ([]string, error)

// Credential adds to res the header names its credential sets, as names returns
// them, to CredentialHeaders and Inject; when names is nil or fails, res names the
// credential and CredentialUnknown says why its headers are unknown. A result
// without a credential is returned as it is.
func Credential(res Result, names HeaderNames) Result {
	if res.Credential == "" {
		return res
	}
	if names == nil {
		res.CredentialUnknown = "no credential backend to ask"
		return res
	}
	hs, err := names(res.Credential)
	if err != nil {
		res.CredentialUnknown = err.Error()
		return res
	}
	res.CredentialHeaders = []string{}
	for _, h := range hs {
		res.CredentialHeaders = addName(res.CredentialHeaders, h)
		res.Inject = addName(res.Inject, h)
	}
	return res
}

// addName appends the canonical form of name unless names holds it already.
func addName(names []string, name string) []string {
	name = http.CanonicalHeaderKey(name)
	if slices.Contains(names, name) {
		return names
	}
	return append(names, name)
}

// SecretNames is the header names a credential of shape s sets: its headers, or
// Authorization for oauth2 and github_app (the minted token), the SigV4 headers for aws; none for
// environment_variable.
func SecretNames(s credential.Secret) []string {
	names := make([]string, 0, len(s.Headers)+1)
	for _, h := range s.Headers {
		names = append(names, h.Name)
	}
	if (s.OAuth2 != nil || s.GitHubApp != nil) && len(names) == 0 {
		names = append(names, "Authorization")
	}
	if s.AWS != nil {
		names = append(names, s.AWS.HeaderNames()...)
	}
	return names
}

// FromStore answers HeaderNames from a running egressd's credentials (the last
// good value in memory).
func FromStore(creds inject.Credentials) HeaderNames {
	if creds == nil {
		return nil
	}
	return func(id string) ([]string, error) {
		v, err := creds.Get(id)
		if err != nil {
			return nil, err
		}
		return SecretNames(credential.Secret{Headers: v.Headers, OAuth2: v.OAuth2, Env: v.Env, GitHubApp: v.GitHubApp, AWS: v.AWS}), nil
	}
}

// FromBackend answers HeaderNames by reading the credential from b.
func FromBackend(ctx context.Context, b credential.Backend) HeaderNames {
	return func(id string) ([]string, error) {
		s, _, err := b.Read(ctx, id)
		if err != nil {
			return nil, err
		}
		return SecretNames(s), nil
	}
}

// EnvVarOf returns credential id's environment_variable shape (nil for another
// type), or an error when the credential backend cannot say.
type EnvVarOf func(id string) (*credential.EnvVar, error)

// Placeholders adds to an allowed res the environment_variable credentials whose
// placeholders egressd replaces in requests to res's host: those of vars (the
// policy's env section, NAME -> credential ID) that trust the host, and the rule's
// own credential when it is one without trusted domains. Over https egressd then
// intercepts the host whatever the rule says, as the proxy does.
func Placeholders(res Result, vars map[string]string, envOf EnvVarOf) Result {
	if res.Decision != "allow" || envOf == nil {
		return res
	}
	ids := slices.Sorted(maps.Values(vars))
	if res.Credential != "" {
		ids = append(ids, res.Credential)
	}
	for _, id := range slices.Compact(ids) {
		e, err := envOf(id)
		if err != nil || e == nil || !(e.Trusts(res.Host) || len(e.TrustedDomains) == 0 && id == res.Credential) {
			continue
		}
		if slices.ContainsFunc(res.Placeholders, func(p Placeholder) bool { return p.Credential == id }) {
			continue
		}
		p := Placeholder{Credential: id, Variables: []string{}, Locations: slices.Clone(e.Locations)}
		for name, v := range vars {
			if v == id {
				p.Variables = append(p.Variables, name)
			}
		}
		slices.Sort(p.Variables)
		res.Placeholders = append(res.Placeholders, p)
		res.Intercept = res.Intercept || res.Scheme == "https"
	}
	return res
}

// EnvFromStore answers EnvVarOf from a running egressd's credentials.
func EnvFromStore(creds inject.Credentials) EnvVarOf {
	if creds == nil {
		return nil
	}
	return func(id string) (*credential.EnvVar, error) {
		v, err := creds.Get(id)
		return v.Env, err
	}
}

// EnvFromBackend answers EnvVarOf by reading the credential from b.
func EnvFromBackend(ctx context.Context, b credential.Backend) EnvVarOf {
	return func(id string) (*credential.EnvVar, error) {
		s, _, err := b.Read(ctx, id)
		return s.Env, err
	}
}

// HookInfo says how egressd treats a URL that is a hook URL of hooks.json.
type HookInfo struct {
	Group          string  `json:"group"`
	Event          string  `json:"event"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
	FailClosed     bool    `json:"fail_closed"`
	// Answer is what the runtime receives for a POST to this URL when egressd
	// itself refuses it, or "forwarded" when egressd lets it through (signed).
	Answer string `json:"answer"`
}

// Hook adds to res what egressd does with a POST to raw as a hook call: nil Hook
// when raw is no hook URL of an enabled group.
func Hook(res Result, raw string, ix *hooks.Index, failClosed bool) Result {
	u, err := url.Parse(raw)
	if err != nil || ix == nil {
		return res
	}
	m, ok := ix.Lookup(res.Scheme, res.Host, res.Port, u.EscapedPath())
	if !ok {
		return res
	}
	h := &HookInfo{Group: m.Group, Event: m.Event, TimeoutSeconds: m.Timeout.Seconds(), FailClosed: failClosed}
	switch {
	case res.Decision == "allow":
		h.Answer = "forwarded with Egressd-Hook-Assertion"
		res.Intercept = res.Scheme == "https"
	case m.Event == hooks.EventPre && failClosed:
		h.Answer = string(hooks.DenyBody("request refused (" + res.Reason + ")"))
		res.Intercept = res.Scheme == "https"
	default:
		h.Answer = "refused: " + res.Reason
	}
	res.Hook = h
	return res
}
