// Package inject sets the headers an allowlist rule injects into outbound requests.
// Its processors are built once per policy, so a bad rule fails at load, not on the
// hundredth request; the client's copies of every injected header are removed first,
// so the sandbox can neither read nor override what egressd sets.
package inject

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// ErrNoProcessor is returned for an injecting rule the Injector was not built with.
var ErrNoProcessor = errors.New("inject: no processor for the rule (policy and injector differ)")

// Credentials resolves a credential ID to its current headers, from memory.
type Credentials interface {
	Get(id string) (credential.Value, error)
}

// Result is what Apply did, for the canonical log line: header names, the
// credential ID and its version. It never holds a value.
type Result struct {
	Names      []string
	Credential string
	Version    string
}

// Injector holds one processor per injecting rule.
type Injector struct {
	creds Credentials
	rules map[*allowlist.Rule]*processor
}

// processor is what one rule sets: its transform, then its credential's headers,
// which win for the names they share.
type processor struct {
	transform  []allowlist.Header
	credential string
}

// New builds the processors for every rule of p that injects. creds may be nil when
// no rule names a credential.
func New(p *allowlist.Policy, creds Credentials) *Injector {
	in := &Injector{creds: creds, rules: map[*allowlist.Rule]*processor{}}
	for _, r := range p.Rules() {
		if r.Injects() {
			in.rules[r] = &processor{transform: r.Transform, credential: r.Credential}
		}
	}
	return in
}

// Apply sets rule r's headers on h, the outbound request's header, after removing
// every client copy of those names (any case) from h and from trailer. When the
// credential cannot be served it returns the *credential.UnavailableError and leaves
// h untouched: nothing is forwarded without its credential.
func (in *Injector) Apply(r *allowlist.Rule, h, trailer http.Header) (Result, error) {
	p := in.rules[r]
	if p == nil {
		if r != nil && r.Injects() {
			// A rule from another policy than the one the processors were built for:
			// refuse rather than forward without the headers the rule requires.
			return Result{}, ErrNoProcessor
		}
		return Result{}, nil
	}
	var res Result
	var secret []credential.Header
	if p.credential != "" {
		v, err := in.creds.Get(p.credential)
		if err != nil {
			return Result{}, err
		}
		if v.OAuth2 != nil && len(v.Headers) == 0 {
			// An oauth2 client without an access token (no token manager, or none yet):
			// never forward without the header it stands for.
			return Result{}, &credential.UnavailableError{ID: v.ID, Cause: credential.CauseNoAccessToken}
		}
		secret, res.Credential, res.Version = v.Headers, v.ID, v.Version
	}
	for _, x := range p.transform {
		res.Names = addName(res.Names, x.Name)
	}
	for _, x := range secret {
		res.Names = addName(res.Names, x.Name)
	}
	for _, name := range res.Names {
		Remove(h, name)
		Remove(trailer, name)
	}
	for _, x := range p.transform {
		h[x.Name] = []string{x.Value}
	}
	for _, x := range secret {
		h[x.Name] = []string{x.Value}
	}
	return res, nil
}

// Remove deletes every field named name from h, whatever its case: a header map
// built by hand, or a non-canonical key, must not keep a client's copy.
func Remove(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

func addName(names []string, name string) []string {
	name = http.CanonicalHeaderKey(name)
	if slices.Contains(names, name) {
		return names
	}
	return append(names, name)
}
