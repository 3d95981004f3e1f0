package allowlist

import (
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// This file holds the per-field checks Compile runs on each Entry. Every
// message says what is wrong and how to fix it; none echoes a header value.

// pattern validates and normalises an entry's domain.
func (c *compiler) pattern(i int, domain string) (string, bool) {
	msg := domainProblem(domain)
	if msg == "" {
		p, err := normalizePattern(domain)
		if err == nil {
			return p, true
		}
		msg = strings.TrimPrefix(err.Error(), ErrBadHost.Error()+": ")
	}
	c.problem(i, "domain", "%s", msg)
	return "", false
}

// domainProblem catches the shapes that are URLs or broken wildcards rather
// than domains, so the message can name the fix.
func domainProblem(d string) string {
	switch {
	case d == "":
		return `domain is empty; use "example.com", "*.example.com" or "*"`
	case strings.Contains(d, "://"):
		return fmt.Sprintf(`%q contains a scheme; use just the host name, e.g. %q`, d, hostOf(d))
	case strings.ContainsAny(d, "/?#"):
		return fmt.Sprintf(`%q contains a path; use just the host name, e.g. %q`, d, hostOf(d))
	case strings.HasPrefix(d, "."):
		return fmt.Sprintf(`%q starts with a dot; use "*%s" for its subdomains or %q for the host itself`, d, d, d[1:])
	}
	if _, port, hasPort, err := splitHostPort(d); err == nil && hasPort {
		return portProblem(d, port)
	}
	return wildcardProblem(d)
}

// portProblem explains a "host:port" domain.
func portProblem(d, port string) string {
	if _, err := parsePort(port); err != nil {
		return fmt.Sprintf(`%q contains ":"; use just the host name`, d)
	}
	return fmt.Sprintf(`%q contains a port; remove it and use "ports": [%s]`, d, port)
}

// wildcardProblem allows "*" alone or as a leading "*." only.
func wildcardProblem(d string) string {
	rest, _ := strings.CutPrefix(d, "*.")
	switch {
	case d == "*":
		return ""
	case d == "*.":
		return `wildcard "*." has no domain; use "*.example.com" for every subdomain of example.com`
	case !strings.Contains(rest, "*"):
		return ""
	}
	if suffix, ok := strings.CutPrefix(d, "*"); ok && isPlainSuffix(suffix) {
		return fmt.Sprintf(`invalid wildcard %q; use "*.%s" for every subdomain of %s`, d, suffix, suffix)
	}
	return fmt.Sprintf(`invalid wildcard %q; "*" is allowed only alone or as a leading "*.", `+
		`e.g. "*.example.com" for every subdomain of example.com`, d)
}

// isPlainSuffix reports whether "*"+s is the "*example.com" typo.
func isPlainSuffix(s string) bool {
	return s != "" && s[0] != '.' && !strings.Contains(s, "*")
}

// normalizePattern turns a well-shaped domain into its pattern.
func normalizePattern(d string) (string, error) {
	if d == "*" {
		return d, nil
	}
	suffix, isWildcard := strings.CutPrefix(d, "*.")
	host, addr, err := NormalizeHost(suffix)
	switch {
	case err != nil:
		return "", err
	case isWildcard && addr.IsValid():
		return "", fmt.Errorf(`wildcard %q covers an IP address; list the address itself, e.g. %q`, d, host)
	case isWildcard:
		return "*." + host, nil
	}
	return host, nil
}

// hostOf extracts the host from a URL-shaped domain, for suggestions.
func hostOf(d string) string {
	if _, after, ok := strings.Cut(d, "://"); ok {
		d = after
	}
	host, _, _ := strings.Cut(d, "/")
	return host
}

// entryPorts validates an entry's ports; nil means the default ports.
func (c *compiler) entryPorts(i int, ports []uint16) []uint16 {
	switch {
	case ports == nil:
		return c.defaultPorts
	case len(ports) == 0:
		c.problem(i, "ports", `ports is empty; omit it to use network.default_ports`)
	case slices.Contains(ports, 0):
		c.problem(i, "ports", "port 0 is not valid; use 1-65535")
	}
	return sortedPorts(ports)
}

func sortedPorts(ports []uint16) []uint16 {
	s := slices.Clone(ports)
	slices.Sort(s)
	return slices.Compact(s)
}

// transform validates the headers and returns them with canonical names.
func (c *compiler) transform(i int, headers []Header) []Header {
	out := make([]Header, 0, len(headers))
	seen := map[string]bool{}
	for _, h := range headers {
		h.Name = textproto.CanonicalMIMEHeaderKey(h.Name)
		if msg := headerProblem(h); msg != "" {
			c.problem(i, "transform", "%s", msg)
		} else if seen[h.Name] {
			c.problem(i, "transform", "header %q is set twice; set it once", h.Name)
		}
		seen[h.Name] = true
		out = append(out, h)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// headerProblem checks one injected header. The value is never quoted.
func headerProblem(h Header) string {
	if !httpguts.ValidHeaderFieldName(h.Name) {
		return invalidNameProblem(h.Name)
	}
	if why := ReservedHeader(h.Name); why != "" {
		return fmt.Sprintf("header %q cannot be injected: %s", h.Name, why)
	}
	if !httpguts.ValidHeaderFieldValue(h.Value) {
		return fmt.Sprintf("the value of header %q contains CR, LF, NUL or another control character "+
			"(value not shown); remove it", h.Name)
	}
	return ""
}

// invalidNameProblem shows the name only up to its first invalid character:
// a name such as "Authorization: Bearer sk-..." must not leak its secret.
func invalidNameProblem(name string) string {
	if name == "" {
		return "a header name is empty"
	}
	i := strings.IndexFunc(name, func(r rune) bool { return !httpguts.IsTokenRune(r) })
	return fmt.Sprintf("header name %q is not a valid RFC 9110 token: it continues with %q at byte %d "+
		"(the rest is not shown)", name[:i], name[i], i)
}

// credential validates a credential ID.
func (c *compiler) credential(i int, id string) {
	if id == "" || validCredentialID(id) {
		return
	}
	c.problem(i, "credential", `credential ID %q is invalid; use 1-128 characters from A-Z a-z 0-9 . _ / -, `+
		`starting with a letter or digit, with no empty, "." or ".." path segments`, id)
}

// validCredentialID matches ^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$ and, since
// the ID becomes a Vault path, refuses empty, "." and ".." segments, which
// could otherwise climb out of credentials.vault.kv_prefix.
func validCredentialID(id string) bool {
	if len(id) > 128 || !isAlnum(id[0]) {
		return false
	}
	for _, c := range []byte(id) {
		if !isAlnum(c) && c != '.' && c != '_' && c != '/' && c != '-' {
			return false
		}
	}
	for seg := range strings.SplitSeq(id, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// ParsePattern validates and normalises a domain pattern outside an allowlist entry (an
// environment_variable credential's trusted_domains): "api.example.com", "*.example.com"
// or "*". The error says what is wrong and how to fix it.
func ParsePattern(d string) (string, error) {
	if msg := domainProblem(d); msg != "" {
		return "", errors.New(msg)
	}
	p, err := normalizePattern(d)
	if err != nil {
		return "", errors.New(strings.TrimPrefix(err.Error(), ErrBadHost.Error()+": "))
	}
	return p, nil
}

// MatchPattern reports whether the normalised host matches the normalised pattern with the
// allowlist's rules: "*" matches everything, "*.example.com" every subdomain at any depth
// (not example.com itself, never an IP literal), anything else only itself.
func MatchPattern(pattern, host string) bool {
	if pattern == "*" || pattern == host {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	if !ok || !strings.HasSuffix(host, suffix) || len(host) == len(suffix) {
		return false
	}
	_, addr, err := NormalizeHost(host)
	return err == nil && !addr.IsValid()
}

// ValidCredentialID reports whether id is a valid credential ID (as an entry's
// "credential" must be), for the policy's env section.
func ValidCredentialID(id string) bool { return id != "" && validCredentialID(id) }
