package hooks

import (
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Hook URLs are compared in their RFC 3986 §6.2.2 syntax-based normal form, on both
// sides: the URL in hooks.json (Parse) and the request (Index.Lookup). The runtime's
// HTTP client may normalise a URL before sending it (WHATWG fetch and urllib3 remove
// dot segments and treat %2e as a dot), and an endpoint's server may normalise what it
// receives; a spelling that only one side normalises would otherwise be a hook call
// egressd does not recognise, forwarded without its guard.
//
// The normal form of a path:
//
//   - percent-encodings of unreserved characters (ALPHA DIGIT - . _ ~) are decoded and
//     every other percent-encoding is upper-cased (§6.2.2.1, §6.2.2.2): %70re is pre,
//     %2e is a dot, %2f is %2F;
//   - then dot segments are removed (§5.2.4, via url.URL.ResolveReference): /a/../pre,
//     /./pre and /a/%2e%2E/pre are /pre.
//
// Deliberately kept as written, because no common HTTP client or server changes them
// and treating them as equal would join paths an endpoint can tell apart:
//
//   - an encoded slash %2F (or an encoded reserved character) is never decoded: it is
//     data inside one segment, not a separator, so /a%2F..%2Fpre keeps its one segment;
//   - empty segments (//) are not merged (RFC 3986 has no such rule; clients send them);
//   - ";" path parameters are part of the segment (some Java servers strip them; a
//     hook URL is the runtime's to write, and /pre;x is not /pre to Go, Node or Python).
//
// Scheme and host are compared lower-cased (the host as allowlist.NormalizeHost gives
// it) and the port as the effective port, so a default port written out is the same
// URL as none.

// NormalizePath returns the normal form of an escaped URL path (r.URL.EscapedPath()):
// "" and every path that resolves to the root are "/".
func NormalizePath(escaped string) string {
	p := normalizeEscapes(escaped)
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if !strings.Contains(p, "/.") {
		return p // no dot segment: already normal (the common case, without an allocation)
	}
	u, err := url.Parse("http://h" + p)
	if err != nil || u.Host != "h" {
		return p // not a path url.Parse takes: compared as it stands (it matches no hook)
	}
	p = u.ResolveReference(&url.URL{}).EscapedPath()
	if p == "" {
		return "/"
	}
	return p
}

// normalizeEscapes decodes percent-encoded unreserved characters and upper-cases the
// hex digits of the others; a malformed escape is left as it stands.
func normalizeEscapes(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' || i+2 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			b.WriteByte(s[i])
			continue
		}
		if c := byte(v); unreserved(c) {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(s[i+1:i+3]))
		}
		i += 2
	}
	return b.String()
}

// unreserved reports whether c is an RFC 3986 §2.3 unreserved character.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// normalURL renders a parsed http hook in its normal form: lower-case scheme, the
// normalised host, the port only when it is not the scheme's default, the normalised
// path (none when the URL has none), and the query and fragment as written.
func normalURL(h Hook, u *url.URL) string {
	host := h.Target.Host
	if h.Target.IsIP() && h.Target.Addr.Is6() {
		host = "[" + host + "]"
	}
	if h.Target.Port != defaultPort(h.Scheme) {
		host = net.JoinHostPort(h.Target.Host, strconv.Itoa(int(h.Target.Port)))
	}
	n := url.URL{Scheme: h.Scheme, User: u.User, Host: host, ForceQuery: u.ForceQuery,
		RawQuery: u.RawQuery, Fragment: u.Fragment, RawFragment: u.RawFragment}
	if u.EscapedPath() != "" {
		n.Path, _ = url.PathUnescape(h.PPath)
		n.RawPath = h.PPath
	}
	return n.String()
}
