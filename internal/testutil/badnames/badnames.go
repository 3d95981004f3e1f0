// Package badnames lists hosts that are not DNS names (allowlist.ValidateName), for
// the tests that check they are refused before any DNS query.
package badnames

import "strings"

// Case is one host that is not a DNS name, with what is wrong with it.
type Case struct{ Name, Host string }

// Under returns hosts under domain (a "*.domain" entry matches their shape) that are
// not DNS names: each breaks one rule.
func Under(domain string) []Case {
	return []Case{
		{"label starts with -", "-a." + domain},
		{"label ends with -", "a-." + domain},
		{"inner label ends with -", "x.a-." + domain},
		{"label over 63 octets", strings.Repeat("a", 64) + "." + domain},
		{"name over 253 octets", strings.Repeat(strings.Repeat("a", 60)+".", 4) + domain},
		{"empty label", "a.." + domain},
		{"character $", "a$b." + domain},
		{"character *", "a*b." + domain},
		{"character !", "a!b." + domain},
	}
}
