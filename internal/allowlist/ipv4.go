package allowlist

import (
	"net/netip"
	"strings"
)

// This file implements the IPv4 host parsing of the WHATWG URL standard
// (https://url.spec.whatwg.org/#concept-ipv4-parser), which is how browsers,
// curl and inet_aton read hosts such as "127.1", "2130706433" or
// "0x7f.0.0.1". A host that ends in a number is an IPv4 address or an error,
// never a name: otherwise "0x7f.1" could pass the allowlist as a name and
// reach 127.0.0.1 through a resolver that reads it the inet_aton way.

// tooBig stands for every number of 2^32 or more: no IPv4 part can be that
// large, and saturating keeps the arithmetic free of overflow.
const tooBig = 1 << 32

// endsInNumber is the WHATWG "ends in a number" checker; name has had its
// trailing dot removed.
func endsInNumber(name string) bool {
	last := name[strings.LastIndexByte(name, '.')+1:]
	if last != "" && strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, ok := parseIPv4Number(last)
	return ok
}

// parseIPv4 is the WHATWG IPv4 parser: one to four parts, each decimal,
// 0x-hex or 0-octal; every part but the last at most 255, the last one
// filling the remaining bytes ("1.2.3" is 1.2.0.3).
func parseIPv4(name string) (netip.Addr, bool) {
	if strings.Count(name, ".") > 3 {
		return netip.Addr{}, false
	}
	parts := strings.Split(name, ".")
	var v uint64
	for i, p := range parts {
		n, ok := parseIPv4Number(p)
		if !ok || n >= partLimit(i, len(parts)) {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			n <<= 8 * (3 - i)
		}
		v += n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// partLimit is the exclusive upper bound of part i of n.
func partLimit(i, n int) uint64 {
	if i < n-1 {
		return 256
	}
	return 1 << (8 * (5 - n))
}

// parseIPv4Number is the WHATWG IPv4 number parser: "0x" prefix for hex, a
// leading "0" for octal, else decimal; "0x" alone is 0. Values of 2^32 or
// more come back as tooBig.
func parseIPv4Number(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := uint64(10)
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	var v uint64
	for _, c := range []byte(s) {
		d, ok := digitValue(c)
		if !ok || d >= base {
			return 0, false
		}
		v = min(v*base+d, tooBig)
	}
	return v, true
}

func digitValue(c byte) (uint64, bool) {
	switch {
	case '0' <= c && c <= '9':
		return uint64(c - '0'), true
	case 'a' <= c && c <= 'f':
		return uint64(c-'a') + 10, true
	case 'A' <= c && c <= 'F':
		return uint64(c-'A') + 10, true
	}
	return 0, false
}
