package hooks

import (
	"fmt"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/egressd/egressd/internal/allowlist"
)

// LintPolicy warns about allowlist rules that hand a secret to many hosts: a credential
// or an auth-bearing transform on "*", or on a wildcard broader than one registrable
// domain (*.com, *.co.uk, *.github.io: the part after "*." is a public suffix), since
// every host the rule matches receives the secret. A transform is auth-bearing when a
// header's name or value looks like a credential (as for hook headers). Paths are
// relative to the allowlist: "[3].credential"; `egressd check` prefixes them.
//
// It lives here because `egressd check` runs it beside the hooks lint; it judges the
// policy alone.
func LintPolicy(rules []*allowlist.Rule) []Finding {
	var out []Finding
	for _, r := range rules {
		out = append(out, inlineSecrets(r)...)
		broad := broadPattern(r.Pattern)
		if broad == "" {
			continue
		}
		if r.Credential != "" {
			out = append(out, Finding{
				Path: fmt.Sprintf("[%d].credential", r.Index), Severity: SeverityWarning,
				Msg: fmt.Sprintf("credential %s on %q is sent to %s; give it an entry naming the one host that needs it",
					r.Credential, r.Pattern, broad),
			})
		}
		if names := authHeaders(r.Transform); len(names) > 0 {
			out = append(out, Finding{
				Path: fmt.Sprintf("[%d].transform", r.Index), Severity: SeverityWarning,
				Msg: fmt.Sprintf("transform header %s on %q is sent to %s; give it an entry naming the one host that needs it",
					strings.Join(names, ", "), r.Pattern, broad),
			})
		}
	}
	return out
}

// inlineSecrets warns about transform values that look like credentials (the shapes
// the hooks.json header lint refuses): written inline, the secret is in every copy of
// the policy file, and rotating it means editing every one.
func inlineSecrets(r *allowlist.Rule) []Finding {
	var out []Finding
	for _, h := range r.Transform {
		if shape := tokenShaped(h.Value); shape != "" {
			out = append(out, Finding{
				Path: fmt.Sprintf("[%d].transform.%s", r.Index, h.Name), Severity: SeverityWarning,
				Msg: fmt.Sprintf("header %s: its value looks like %s, written inline in the policy; move it to a credential "+
					`(credentials.file or Vault) and name it with "credential" on this entry`, h.Name, shape),
			})
		}
	}
	return out
}

// broadPattern describes the hosts a pattern spans when that is more than one
// registrable domain, else "".
func broadPattern(pattern string) string {
	if pattern == "*" {
		return "every host, IP literals included"
	}
	suffix, ok := strings.CutPrefix(pattern, "*.")
	if !ok {
		return ""
	}
	if _, err := publicsuffix.EffectiveTLDPlusOne(suffix); err != nil {
		return fmt.Sprintf("every domain under the public suffix %q, each owned by someone else", suffix)
	}
	return ""
}

// authHeaders returns the names of the headers that look like credentials.
func authHeaders(hs []allowlist.Header) []string {
	var names []string
	for _, h := range hs {
		if secretName(h.Name) || tokenShaped(h.Value) != "" {
			names = append(names, h.Name)
		}
	}
	return names
}
