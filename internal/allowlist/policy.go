package allowlist

import (
	"fmt"
	"slices"
	"strings"
)

// Entry is one allowlist entry as the config loader hands it over: raw,
// unvalidated strings. Compile turns valid entries into Rules.
type Entry struct {
	Domain         string    // "*", "*.example.com", "example.com", "Bücher.example.", "10.1.2.3", "[::1]"
	Ports          []uint16  // nil: Options.DefaultPorts; non-nil and empty is an error
	Transform      []Header  // already merged from the map and list shapes by the config loader
	Credential     string    // credential ID, "" for none
	AllowPlaintext bool      // inject over plain http:// too (insecure; default false)
	AWS            *AWSScope // "aws": what an aws credential may sign for; nil: none given

	// GitHub is how a github_app credential's token is sent: GitHubAPI ("" too) or GitHubGit.
	GitHub string
}

// Rule is a compiled entry. Rules belong to their Policy: never modify one.
type Rule struct {
	Index          int      // position in the allowlist (0-based)
	Pattern        string   // normalised: "*", "*.example.com", "example.com", "10.1.2.3", "::1"
	Ports          []uint16 // effective ports (the entry's or the defaults), sorted, no duplicates
	Transform      []Header // canonical names; values may be secrets
	Credential     string   // credential ID, "" for none
	AllowPlaintext bool
	GitHub         string    // GitHubAPI or GitHubGit, never ""
	AWS            *AWSScope // the regions and services an aws credential signs for; nil: none
}

// Injects reports whether the rule adds headers: a transform or a credential.
func (r *Rule) Injects() bool { return len(r.Transform) > 0 || r.Credential != "" }

// AllowsPort reports whether p is one of the rule's effective ports.
func (r *Rule) AllowsPort(p uint16) bool {
	for _, q := range r.Ports {
		if q == p {
			return true
		}
	}
	return false
}

// InterceptMode is tls.intercept: which tunnels egressd terminates.
type InterceptMode string

// Intercept modes. InterceptAuto terminates TLS only for rules that inject;
// InterceptAll terminates every allowed tunnel; InterceptNone never does, so
// no rule may inject.
const (
	InterceptAuto InterceptMode = "auto"
	InterceptAll  InterceptMode = "all"
	InterceptNone InterceptMode = "none"
)

// InterceptModes are the valid modes, in the order messages list them. The
// config loader and Compile check tls.intercept against this one list.
var InterceptModes = []InterceptMode{InterceptAuto, InterceptAll, InterceptNone}

// Valid reports whether m is one of InterceptModes.
func (m InterceptMode) Valid() bool { return slices.Contains(InterceptModes, m) }

// Options are the operator settings Compile needs besides the entries.
type Options struct {
	DefaultPorts []uint16      // network.default_ports; empty means [80, 443]
	Intercept    InterceptMode // tls.intercept; "" means auto
}

// EntryError is one problem in one entry, so the config loader can print
// "network.allowlist[3].domain: ...". Index is the entry's position; Field is
// "domain", "ports", "transform" or "credential". For a problem in Options,
// Index is -1 and Field is the config path ("tls.intercept",
// "network.default_ports").
type EntryError struct {
	Index int
	Field string
	Msg   string
}

// Error renders the problem with its path.
func (e EntryError) Error() string {
	if e.Index < 0 {
		return e.Field + ": " + e.Msg
	}
	return fmt.Sprintf("allowlist[%d].%s: %s", e.Index, e.Field, e.Msg)
}

// CompileError lists every problem Compile found, in entry order.
type CompileError struct{ Problems []EntryError }

// Error lists all problems, one per line.
func (e *CompileError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid allowlist (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  " + p.Error())
	}
	return b.String()
}

// Unwrap returns the problems, so errors.As finds an EntryError.
func (e *CompileError) Unwrap() []error {
	errs := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		errs[i] = p
	}
	return errs
}

// Policy is a compiled allowlist. It is immutable after Compile and safe for
// concurrent use.
type Policy struct {
	rules    []*Rule
	exact    map[string]*Rule // normalised name or IP text -> rule
	wildcard map[string]*Rule // "example.com" for "*.example.com" -> rule
	any      *Rule            // the "*" rule, or nil
	mode     InterceptMode
}

// Rules returns the compiled rules in allowlist order. The slice is a copy;
// the rules are shared and must not be modified.
func (p *Policy) Rules() []*Rule { return slices.Clone(p.rules) }

// Intercepts reports whether the policy may terminate TLS at all (tls.intercept is
// not none): only then does the sandbox trust egressd's CA.
func (p *Policy) Intercepts() bool { return p.mode != InterceptNone }

// Compile validates the entries and builds the Policy. It reports every
// problem at once as a *CompileError, each with the fix in its message.
func Compile(entries []Entry, opts Options) (*Policy, error) {
	c := newCompiler(opts)
	for i, e := range entries {
		c.add(i, e)
	}
	if len(c.problems) > 0 {
		return nil, &CompileError{Problems: c.problems}
	}
	return c.policy, nil
}

// compiler accumulates the policy and the problems found on the way.
type compiler struct {
	policy       *Policy
	defaultPorts []uint16
	seen         map[string]int // pattern -> index of the entry that has it
	problems     []EntryError
}

func newCompiler(opts Options) *compiler {
	c := &compiler{
		policy: &Policy{exact: map[string]*Rule{}, wildcard: map[string]*Rule{}},
		seen:   map[string]int{},
	}
	c.policy.mode = c.interceptMode(opts.Intercept)
	c.defaultPorts = c.optionPorts(opts.DefaultPorts)
	return c
}

func (c *compiler) problem(index int, field, format string, args ...any) {
	c.problems = append(c.problems, EntryError{Index: index, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// interceptMode validates tls.intercept; "" is auto.
func (c *compiler) interceptMode(m InterceptMode) InterceptMode {
	switch {
	case m == "":
		return InterceptAuto
	case m.Valid():
		return m
	}
	c.problem(-1, "tls.intercept", "unknown mode %q; use auto, all or none", string(m))
	return InterceptAuto
}

// optionPorts validates network.default_ports; empty means [80, 443].
func (c *compiler) optionPorts(ports []uint16) []uint16 {
	if len(ports) == 0 {
		return DefaultPorts()
	}
	if slices.Contains(ports, 0) {
		c.problem(-1, "network.default_ports", "port 0 is not valid; use 1-65535")
	}
	return sortedPorts(ports)
}

// add validates entry i and, when its domain is valid and new, indexes it.
func (c *compiler) add(i int, e Entry) {
	r := &Rule{
		Index:          i,
		Ports:          c.entryPorts(i, e.Ports),
		Transform:      c.transform(i, e.Transform),
		Credential:     e.Credential,
		AllowPlaintext: e.AllowPlaintext,
		AWS:            c.awsScope(i, e.Credential, e.AWS),
	}
	c.credential(i, e.Credential)
	r.GitHub = c.github(i, e)
	c.checkInterceptable(r)
	pattern, ok := c.pattern(i, e.Domain)
	if !ok {
		return
	}
	r.Pattern = pattern
	if prev, dup := c.seen[pattern]; dup {
		c.problem(i, "domain", "%q duplicates entry %d (%q); merge the two entries", e.Domain, prev, pattern)
		return
	}
	c.seen[pattern] = i
	c.policy.insert(r)
}

// checkInterceptable refuses injection when TLS is never terminated: the
// headers could never be added, and the operator must know at load time.
func (c *compiler) checkInterceptable(r *Rule) {
	if c.policy.mode != InterceptNone || !r.Injects() {
		return
	}
	field := "credential"
	if len(r.Transform) > 0 {
		field = "transform"
	}
	c.problem(r.Index, field, "tls.intercept none cannot inject headers for entry %d; "+
		"set tls.intercept to auto or remove the entry's transform and credential", r.Index)
}

// insert indexes a rule by the kind of its pattern.
func (p *Policy) insert(r *Rule) {
	p.rules = append(p.rules, r)
	switch suffix, isWildcard := strings.CutPrefix(r.Pattern, "*."); {
	case r.Pattern == "*":
		p.any = r
	case isWildcard:
		p.wildcard[suffix] = r
	default:
		p.exact[r.Pattern] = r
	}
}
