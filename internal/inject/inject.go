// Package inject sets the headers an allowlist rule injects into outbound requests.
// Its processors are built once per policy, so a bad rule fails at load, not on the
// hundredth request; the client's copies of every injected header are removed first,
// so the sandbox can neither read nor override what egressd sets. With the headers it
// hands back the scrub.Set that masks those very values in the response.
package inject

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/scrub"
)

// ErrNoProcessor is returned for an injecting rule the Injector was not built with.
var ErrNoProcessor = errors.New("inject: no processor for the rule (policy and injector differ)")

// Credentials resolves a credential ID to its current headers, from memory.
type Credentials interface {
	Get(id string) (credential.Value, error)
}

// Awaiter is Credentials that can wait, bounded, for a credential whose first read is
// still in flight after a start (credential.FirstReadWait).
type Awaiter interface {
	Await(ctx context.Context, id string)
}

// Result is what Apply did: for the canonical log line, header names, the
// credential ID and its version; for the response, Scrub. It never exposes a
// value (a scrub.Set renders none).
type Result struct {
	Names      []string
	Credential string
	Version    string
	// Scrub masks every value Apply set; nil when it set nothing.
	Scrub *scrub.Set

	// GitHub: the credential is a github_app (see RevokesGitHubToken).
	GitHub bool
	// KeysOnly: Scrub holds an aws credential's keys and nothing else, values no
	// upstream can be made to store in a body the sandbox reads back (docs/aws.md),
	// so a part of a response cannot cut a value that matters.
	KeysOnly bool
	// aws is set for an aws credential: Sign signs the request with its keys.
	aws *awsSigning
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
	scrub      atomic.Pointer[compiled] // the Set for the values last injected
}

// compiled is a scrub.Set with the values it was compiled from.
type compiled struct {
	values []string
	set    *scrub.Set
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

// Credentials returns the credentials the Injector reads (nil when none were given):
// explain lists the header names a credential sets from them.
func (in *Injector) Credentials() Credentials { return in.creds }

// Await waits, as the Credentials allow (Awaiter), for the first read of r's credential
// when it is still in flight, so that the first request after a start is served
// rather than refused. It returns at once for a credential read before.
func (in *Injector) Await(ctx context.Context, r *allowlist.Rule) {
	p := in.rules[r]
	if p == nil || p.credential == "" {
		return
	}
	if a, ok := in.creds.(Awaiter); ok {
		a.Await(ctx, p.credential)
	}
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
	var secret, scrubOnly []credential.Header // scrubOnly: values masked, never set (aws keys)
	if p.credential != "" {
		v, err := in.creds.Get(p.credential)
		if err != nil {
			return Result{}, err
		}
		if (v.OAuth2 != nil || v.GitHubApp != nil) && len(v.Headers) == 0 {
			// An oauth2 client or GitHub App without a token (no token manager, or none
			// yet): never forward without the header it stands for.
			return Result{}, &credential.UnavailableError{ID: v.ID, Cause: credential.CauseNoAccessToken}
		}
		if v.AWS != nil && !v.AWS.Usable(time.Now()) {
			// vault_aws keys not read yet, or expired: never forward the sandbox's signature.
			return Result{}, &credential.UnavailableError{ID: v.ID, Cause: credential.CauseNoAWSKeys}
		}
		secret, res.Credential, res.Version = githubHeaders(r, v), v.ID, v.Version
		res.GitHub = v.GitHubApp != nil
		if v.AWS != nil {
			res.aws = &awsSigning{keys: v.AWS, scope: r.AWS}
			scrubOnly = awsSecrets(v.AWS)
		}
	}
	for _, x := range p.transform {
		res.Names = addName(res.Names, x.Name)
	}
	for _, x := range secret {
		res.Names = addName(res.Names, x.Name)
	}
	if res.aws != nil {
		// Left in h for Sign to check; removed from the trailer like any injected name.
		for _, name := range res.aws.keys.HeaderNames() {
			res.Names = addName(res.Names, name)
		}
	}
	for _, name := range res.Names {
		Remove(trailer, name)
		if res.aws == nil || !slices.Contains(res.aws.keys.HeaderNames(), name) {
			Remove(h, name)
		}
	}
	for _, x := range p.transform {
		h[x.Name] = []string{x.Value}
	}
	for _, x := range secret {
		h[x.Name] = []string{x.Value}
	}
	res.KeysOnly = res.aws != nil && len(p.transform) == 0 && len(secret) == 0
	if scrubOnly != nil {
		secret = slices.Concat(secret, scrubOnly) // a new slice: v.Headers is shared
	}
	res.Scrub = p.scrubSet(secret)
	return res, nil
}

// scrubSet returns the Set for the transform's and secret's values, compiled once
// per change of values rather than per request: compiling costs orders of
// magnitude more than a cached Apply (BenchmarkCompileScrub, BenchmarkApply),
// and a credential changes seldom. The
// cache is keyed by the values themselves, not the backend's version, so a
// backend that swaps a value without a new version still gets it masked.
func (p *processor) scrubSet(secret []credential.Header) *scrub.Set {
	c := p.scrub.Load()
	if c != nil && c.matches(p.transform, secret) {
		return c.set
	}
	values := make([]string, 0, len(p.transform)+len(secret))
	for _, x := range p.transform {
		values = append(values, x.Value)
	}
	for _, x := range secret {
		values = append(values, x.Value)
	}
	c = &compiled{values: values, set: scrub.Compile(values...)}
	p.scrub.Store(c)
	return c.set
}

// matches reports whether c was compiled from exactly these values, in order.
func (c *compiled) matches(transform []allowlist.Header, secret []credential.Header) bool {
	if len(c.values) != len(transform)+len(secret) {
		return false
	}
	for i, x := range transform {
		if c.values[i] != x.Value {
			return false
		}
	}
	for i, x := range secret {
		if c.values[len(transform)+i] != x.Value {
			return false
		}
	}
	return true
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
