package allowlist

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// ErrBadHost is wrapped by every error NormalizeHost and ParseAuthority
// return, so callers can map them to bad_request with errors.Is.
var ErrBadHost = errors.New("bad host")

// ErrBadName is wrapped by the errors of a host that is a name but not a DNS
// name (see ValidateName); such errors wrap ErrBadHost too. The proxy answers
// them with bad_request detail bad_name, the DNS guard with REFUSED.
var ErrBadName = errors.New("bad name")

// nameError is a host rejected as a name: errors.Is matches both ErrBadName
// and ErrBadHost, and the message reads like every other ErrBadHost message.
type nameError struct{ msg string }

func (e *nameError) Error() string { return ErrBadHost.Error() + ": " + e.msg }

func (e *nameError) Is(target error) bool { return target == ErrBadName || target == ErrBadHost }

// DNS limits (RFC 1035 section 2.3.4), on the ASCII form without the root dot.
const (
	maxLabelLen = 63
	maxNameLen  = 253
)

// maxRawLen bounds the input before any parsing: four times a DNS name
// leaves room for Unicode spellings, and the IDNA work stays small whatever
// a client sends.
const maxRawLen = 4 * maxNameLen

// idnaProfile is the UTS #46 lookup profile (nontransitional, Bidi and
// ContextJ rules) with the two relaxations every browser applies through the
// WHATWG URL standard: CheckHyphens off, so real names such as
// "r3---sn-apo3qvuoxuxbt-j5pe.googlevideo.com" pass, and UseSTD3ASCIIRules
// off, so "_" passes. checkLabel then limits ASCII names to letters,
// digits, "-" and "_", which is stricter than WHATWG and enough for DNS.
var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.Transitional(false),
	idna.CheckHyphens(false),
	idna.StrictDomainName(false),
)

// NormalizeHost returns the canonical form of a host: lower-case, IDNA to
// punycode, trailing dot removed. An IP literal (bracketed or bare IPv6, or
// any IPv4 spelling the WHATWG URL standard and inet_aton accept, such as
// "127.1", "2130706433" or "0x7f.0.0.1") yields its netip.Addr, and host is
// then addr.String(). IPv4-mapped IPv6 stays IPv6. Errors wrap ErrBadHost.
// The result is idempotent: NormalizeHost(host) returns host again.
func NormalizeHost(raw string) (host string, addr netip.Addr, err error) {
	switch {
	case raw == "":
		return "", netip.Addr{}, badHost("empty host")
	case len(raw) > maxRawLen:
		return "", netip.Addr{}, badName("%s is longer than %d bytes", quote(raw), maxRawLen)
	}
	if err := checkRawChars(raw); err != nil {
		return "", netip.Addr{}, err
	}
	if raw[0] == '[' {
		return normalizeBracketed(raw)
	}
	if strings.IndexByte(raw, ':') >= 0 {
		return normalizeIPv6(raw, raw)
	}
	return normalizeName(raw)
}

// checkRawChars rejects the characters that signal a URL fragment rather
// than a host, with a message naming the likely mistake.
func checkRawChars(raw string) error {
	if !utf8.ValidString(raw) {
		return badHost("invalid UTF-8")
	}
	for _, c := range []byte(raw) {
		switch {
		case c <= ' ' || c == 0x7f:
			return badHost("%s contains whitespace or a control character", quote(raw))
		case c == '%':
			return badHost("%s contains %%: IPv6 zone IDs and percent-encoding are not allowed", quote(raw))
		case c == '@':
			return badHost("%s contains userinfo (@)", quote(raw))
		case c == '/' || c == '\\' || c == '?' || c == '#':
			return badHost("%s contains a path, query or fragment", quote(raw))
		}
	}
	return nil
}

// normalizeBracketed handles "[v6]".
func normalizeBracketed(raw string) (string, netip.Addr, error) {
	inner, ok := strings.CutPrefix(raw, "[")
	inner, ok2 := strings.CutSuffix(inner, "]")
	if !ok || !ok2 || strings.ContainsAny(inner, "[]") {
		return "", netip.Addr{}, badHost("%s has unbalanced brackets", quote(raw))
	}
	return normalizeIPv6(inner, raw)
}

// normalizeIPv6 parses an IPv6 literal without brackets; raw is for messages.
func normalizeIPv6(s, raw string) (string, netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	switch {
	case err == nil && addr.Is6():
		return addr.String(), addr, nil
	case raw[0] != '[' && strings.Count(raw, ":") == 1:
		return "", netip.Addr{}, badHost("%s contains \":\"; give the host without a port", quote(raw))
	}
	return "", netip.Addr{}, badHost("%s is not a valid IPv6 address", quote(raw))
}

// normalizeName maps a name through IDNA, then applies the WHATWG
// "ends in a number" rule and the DNS length and character limits.
func normalizeName(raw string) (string, netip.Addr, error) {
	name, err := toASCII(raw)
	if err != nil {
		return "", netip.Addr{}, badName("%s is not a valid internationalised name: %v", quote(raw), err)
	}
	name = strings.TrimSuffix(name, ".")
	if endsInNumber(name) {
		return normalizeIPv4(name, raw)
	}
	if err := checkName(name, raw); err != nil {
		return "", netip.Addr{}, err
	}
	return name, netip.Addr{}, nil
}

// toASCII runs IDNA and, when the result holds punycode, runs it again on
// the result. x/net/idna applies the Bidi rule to the input instead of the
// mapped text: "ℸa" maps to Hebrew "דa" and converts, but its own output
// "xn--a-5hc" is refused. UTS #46 refuses both; refusing them here keeps
// NormalizeHost idempotent, so a name cannot change meaning on a second pass.
func toASCII(raw string) (string, error) {
	name, err := idnaProfile.ToASCII(raw)
	if err != nil || !strings.Contains(name, "xn--") {
		return name, err
	}
	again, err := idnaProfile.ToASCII(name)
	if err == nil && again != name {
		err = fmt.Errorf("idna: %q is not stable under conversion", name)
	}
	return name, err
}

func normalizeIPv4(name, raw string) (string, netip.Addr, error) {
	addr, ok := parseIPv4(name)
	if !ok {
		return "", netip.Addr{}, badHost("%s ends in a number but is not a valid IPv4 address", quote(raw))
	}
	return addr.String(), addr, nil
}

// ValidateName reports whether name, a normalised (lower-case ASCII, no root
// dot) host name, is a DNS name egressd will look up: 1 to 253 characters, in
// labels of 1 to 63 characters (RFC 1035 §2.3.4) made of letters, digits, "-"
// and "_", none starting or ending with "-" (RFC 952, RFC 1123 §2.1). "_" is
// allowed anywhere: the hostname rules exclude it, but DNS carries it (RFC
// 2181 §11), real hosts use it ("_dmarc", legacy S3 buckets, some internal
// names) and WHATWG URL parsing, which every browser applies, accepts it.
// "--" inside a label stays allowed ("r3---sn-x.googlevideo.com", punycode).
// NormalizeHost applies it to every name, so the allowlist's patterns, the
// proxy's targets and the DNS guard's questions are held to this one rule.
// Errors wrap ErrBadName (and ErrBadHost).
func ValidateName(name string) error { return checkName(name, name) }

// checkName is ValidateName, naming raw (the host as given) in messages.
func checkName(name, raw string) error {
	if name == "" {
		return badName("empty host")
	}
	if len(name) > maxNameLen {
		return badName("%s is longer than %d characters", quote(raw), maxNameLen)
	}
	for label := range strings.SplitSeq(name, ".") {
		if err := checkLabel(label, raw); err != nil {
			return err
		}
	}
	return nil
}

func checkLabel(label, raw string) error {
	switch {
	case label == "":
		return badName("%s has an empty label", quote(raw))
	case len(label) > maxLabelLen:
		return badName("%s has a label longer than %d characters", quote(raw), maxLabelLen)
	case label[0] == '-' || label[len(label)-1] == '-':
		return badName("%s has a label that starts or ends with \"-\"", quote(raw))
	}
	for _, c := range []byte(label) {
		if !isNameChar(c) {
			return badName("%s contains the character %q, which is not allowed in a host name", quote(raw), c)
		}
	}
	return nil
}

func isNameChar(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func badName(format string, args ...any) error {
	return &nameError{msg: fmt.Sprintf(format, args...)}
}

func badHost(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadHost}, args...)...)
}

// quote quotes s for an error message, shortened so that a hostile 64 KiB
// host does not end up whole in a log line.
func quote(s string) string {
	const maxQuoted = 80
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q...", s[:maxQuoted])
	}
	return fmt.Sprintf("%q", s)
}
