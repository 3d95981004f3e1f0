package allowlist

import "strings"

// Decision is the verdict for one target, carried through the pipeline.
// Later stages (resolution, the address guard, interception) may refine it
// by setting Reason and Detail.
type Decision struct {
	Target    Target
	Reason    Reason // ReasonNone when allowed
	Detail    string // e.g. the address class for internal_address, "no_sni"; set by later stages
	Rule      *Rule  // the winning rule; nil when nothing matched
	Intercept bool   // terminate TLS: mode all, or mode auto and the rule injects; false when denied
}

// Allowed reports whether the decision lets the request through.
func (d Decision) Allowed() bool { return d.Reason == ReasonNone }

// RuleName is the winning rule's pattern, or "" when none matched.
func (d Decision) RuleName() string {
	if d.Rule == nil {
		return ""
	}
	return d.Rule.Pattern
}

// Decide applies the allowlist to t, whose Host must be normalised (see
// ParseAuthority). Checks run in the docs/reasons.md order: bad_request (no host),
// not_allowlisted (no rule matches), port_not_allowed (the winning rule does
// not list the port). The most specific rule wins: the exact name or IP, then
// the longest wildcard suffix, then "*"; headers come only from the winner.
// Decide costs one map lookup per label and does not allocate.
func (p *Policy) Decide(t Target) Decision {
	d := Decision{Target: t}
	if t.Host == "" {
		d.Reason = ReasonBadRequest
		return d
	}
	d.Rule = p.match(t)
	switch {
	case d.Rule == nil:
		d.Reason = ReasonNotAllowlisted
	case !d.Rule.AllowsPort(t.Port):
		d.Reason = ReasonPortNotAllowed
	default:
		d.Intercept = p.intercepts(d.Rule)
	}
	return d
}

// DecideRequest is Decide for a request whose scheme egressd sees ("http" or
// "https"; "" for a tunnel): after the port check it refuses, with
// plaintext_credential, a plain-http request whose rule would inject headers,
// unless the rule sets allow_plaintext.
func (p *Policy) DecideRequest(t Target, scheme string) Decision {
	d := p.Decide(t)
	if d.Allowed() && scheme == "http" && d.Rule.Injects() && !d.Rule.AllowPlaintext {
		d.Reason, d.Intercept = ReasonPlaintextCredential, false
	}
	return d
}

// match finds the most specific rule. For "a.b.example.com" it tries the
// exact map, then the wildcard map with "b.example.com", "example.com" and
// "com" (longest suffix first, always on a label boundary), then "*".
// Wildcards never match IP literals.
func (p *Policy) match(t Target) *Rule {
	if r, ok := p.exact[t.Host]; ok {
		return r
	}
	if t.IsIP() {
		return p.any
	}
	for rest := t.Host; ; {
		_, after, found := strings.Cut(rest, ".")
		if !found {
			return p.any
		}
		if r, ok := p.wildcard[after]; ok {
			return r
		}
		rest = after
	}
}

// intercepts reports whether an allowed request under r has its TLS
// terminated.
func (p *Policy) intercepts(r *Rule) bool {
	switch p.mode {
	case InterceptAll:
		return true
	case InterceptAuto:
		return r.Injects()
	}
	return false
}
