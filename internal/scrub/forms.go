package scrub

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"html"
	"net/url"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MinLen is the shortest secret value (in bytes) scrubbed on its own.
//
// The trade-off: every occurrence of a pattern is masked in every response of
// an injected request, so a short value masks unrelated content (a 4-byte
// password "1234" would mask every 1234 in a JSON body, and the masks would
// corrupt it), and the mask itself is an oracle: a sandbox that can make the
// upstream echo a guess learns whether the guess was the value. A guess has to
// be the whole value to be masked, so for 8 bytes of even a small alphabet that
// oracle costs millions of requests. Real API keys, tokens and passwords are
// longer than 8 bytes; shorter ones are counted by Set.Skipped so the caller can
// warn. The minimum applies to values, not to forms: every form of a value that
// is scrubbed is scrubbed whatever its own length (none is shorter than the raw
// value but the base64 cores, which for 8 bytes are still 9 characters), so
// masking is never weaker than for the raw value. A derived value below the
// minimum (the password of a Basic credential, the token after a scheme) is not
// scrubbed alone, but the full value that holds it still is.
const MinLen = 8

// maxSchemeLen bounds the auth-scheme word before a space ("Bearer", "Basic",
// "Token") that makes the rest of a value a value of its own.
const maxSchemeLen = 32

// values returns v and the values derived from it that are secret on their
// own: for "<scheme> <credentials>" the credentials; for Basic also the
// decoded "user:password" and the password.
func values(v string) []string {
	out := []string{v}
	scheme, rest, ok := strings.Cut(v, " ")
	rest = strings.TrimLeft(rest, " ")
	if !ok || rest == "" || len(scheme) > maxSchemeLen || !isToken(scheme) {
		return out
	}
	out = append(out, rest)
	if !strings.EqualFold(scheme, "basic") {
		return out
	}
	dec, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		dec, err = base64.RawStdEncoding.DecodeString(rest)
	}
	if err != nil {
		return out
	}
	out = append(out, string(dec))
	if _, pass, ok := strings.Cut(string(dec), ":"); ok && pass != "" {
		out = append(out, pass)
	}
	return out
}

// isToken reports whether s is an RFC 9110 token (an auth-scheme).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return s != ""
}

// forms returns every encoding of v that is scrubbed (v itself first). Which
// forms, and why each:
//   - raw;
//   - base64 (standard and URL-safe alphabets, padded and unpadded) of v alone,
//     and the three "cores" of v inside a longer base64 string (v starting at a
//     byte offset of 0, 1 or 2 modulo 3: a token inside base64'd JSON, the
//     password inside Basic base64(user:pass)); a core is the run of characters
//     whose six bits all come from v;
//   - percent encoding: net/url QueryEscape (space as '+') and PathEscape, the
//     JavaScript encodeURIComponent set, and every byte encoded, each with
//     upper- and lower-case hex;
//   - JSON string escapes: encoding/json with and without HTML escaping (\u003c
//     for <, >, &), \u00XX in upper-case hex (other encoders), "\/" for "/" (PHP
//     and others), and every non-ASCII rune as \uXXXX (Python's ensure_ascii);
//   - HTML escapes, as html.EscapeString writes them (&#34; &#39;) and as
//     other engines do (&quot; &#x27;): a debug page that quotes a request;
//   - hex, lower and upper case;
//   - the standard base64 form percent-encoded and with "\/" (a Basic
//     credential in a query string or a PHP JSON body);
//   - v upper- and lower-cased (a server that re-cases what it echoes, a key
//     in a case-insensitive store);
//   - base32 (RFC 4648 standard alphabet), padded and unpadded;
//   - JSON with every character escaped as \uXXXX, in lower- and upper-case
//     hex (an obfuscating encoder);
//   - UTF-16, little- and big-endian, without a byte order mark (Windows
//     APIs, Java and .NET serialisations);
//   - MIME base64 (RFC 2045) of v alone: the standard form broken into lines
//     of 76 or 64 characters (PEM), by CRLF or LF: a mail part or PEM block
//     that holds only the value;
//   - hex with a space between bytes, lower and upper case (an S3 signature
//     error quoting the canonical request);
//   - hex with ':' between bytes and with "\x" before each, lower and upper
//     case (fingerprints, C and Python byte strings).
//
// The order is FuzzReader's: its seeds pick forms by index.
func forms(v string) []string {
	var out []string
	add := func(s ...string) { out = append(out, s...) }
	add(v)
	add(base64Forms(v)...)
	add(percentForms(v)...)
	add(jsonForms(v)...)
	add(html.EscapeString(v), htmlNamed.Replace(v))
	add(hex.EncodeToString([]byte(v)), strings.ToUpper(hex.EncodeToString([]byte(v))))
	std := base64.StdEncoding.EncodeToString([]byte(v))
	add(url.QueryEscape(std), lowerPercentHex(url.QueryEscape(std)), strings.ReplaceAll(std, "/", `\/`))
	add(strings.ToUpper(v), strings.ToLower(v))
	add(base32.StdEncoding.EncodeToString([]byte(v)), base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(v)))
	add(escapeRunes(v, false, true), escapeRunes(v, true, true))
	add(utf16Form(v, binary.LittleEndian), utf16Form(v, binary.BigEndian))
	add(mimeForms(std)...)
	spaced := spacedHex(v)
	add(spaced, strings.ToUpper(spaced))
	for _, sep := range []string{":", `\x`} {
		h := joinedHex(v, sep)
		add(h, strings.ReplaceAll(strings.ToUpper(h), `\X`, `\x`))
	}
	return out
}

// joinedHex is v as lower-case hex with sep between bytes (":", as
// fingerprints are written) or before each ("\x", C and Python byte escapes).
func joinedHex(v, sep string) string {
	h := strings.TrimPrefix(spacedHex(v), " ")
	h = strings.ReplaceAll(h, " ", sep)
	if sep == `\x` {
		h = sep + h
	}
	return h
}

// spacedHex is v as hex with a space between bytes, as S3's SignatureDoesNotMatch
// error quotes a request (CanonicalRequestBytes, StringToSignBytes).
func spacedHex(v string) string {
	var b strings.Builder
	for i := range len(v) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(hex.EncodeToString([]byte{v[i]}))
	}
	return b.String()
}

// MIME base64 line lengths: RFC 2045's 76 and PEM's (RFC 7468) 64.
var mimeWidths = []int{76, 64}

// mimeForms returns std broken into lines at each of mimeWidths, by CRLF and
// by LF; none when std fits on one line (it is then std itself).
func mimeForms(std string) []string {
	var out []string
	for _, w := range mimeWidths {
		if len(std) <= w {
			continue
		}
		var lines []string
		for rest := std; rest != ""; {
			n := min(w, len(rest))
			lines, rest = append(lines, rest[:n]), rest[n:]
		}
		out = append(out, strings.Join(lines, "\r\n"), strings.Join(lines, "\n"))
	}
	return out
}

// utf16Form returns v in UTF-16 with the given byte order (invalid UTF-8
// as U+FFFD, as a converter writes it).
func utf16Form(v string, order binary.AppendByteOrder) string {
	var b []byte
	for _, u := range utf16.Encode([]rune(v)) {
		b = order.AppendUint16(b, u)
	}
	return string(b)
}

// htmlNamed escapes like many template engines: named entities for quotes.
var htmlNamed = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;")

// base64Forms returns v in both alphabets, padded, unpadded and as the three
// embedded cores.
func base64Forms(v string) []string {
	var out []string
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		out = append(out, enc.EncodeToString([]byte(v)), enc.WithPadding(base64.NoPadding).EncodeToString([]byte(v)))
		for k := 0; k < 3; k++ {
			if c := base64Core(enc, v, k); c != "" {
				out = append(out, c)
			}
		}
	}
	return out
}

// base64Core returns the characters of a base64 stream that depend only on v
// when v starts k bytes into a 3-byte group: characters i with bits
// [6i, 6i+6) inside v's bits [8k, 8k+8len(v)).
func base64Core(enc *base64.Encoding, v string, k int) string {
	s := enc.WithPadding(base64.NoPadding).EncodeToString(append(make([]byte, k), v...))
	from := (8*k + 5) / 6
	to := (8 * (k + len(v))) / 6
	if to <= from {
		return ""
	}
	return s[from:to]
}

// percentForms returns the percent encodings of v.
func percentForms(v string) []string {
	var out []string
	for _, s := range []string{url.QueryEscape(v), url.PathEscape(v), escapeComponent(v), escapeAll(v)} {
		out = append(out, s, lowerPercentHex(s))
	}
	return out
}

// escapeComponent encodes like JavaScript's encodeURIComponent: everything
// but A-Z a-z 0-9 - _ . ! ~ * ' ( ).
func escapeComponent(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteString(pctByte(c))
	}
	return b.String()
}

// escapeAll percent-encodes every byte of v.
func escapeAll(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		b.WriteString(pctByte(v[i]))
	}
	return b.String()
}

// pctByte is "%XX" with upper-case hex.
func pctByte(c byte) string {
	const digits = "0123456789ABCDEF"
	return string([]byte{'%', digits[c>>4], digits[c&15]})
}

// lowerPercentHex lower-cases the two hex digits after each '%'.
func lowerPercentHex(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = lowerHex(b[i+1]), lowerHex(b[i+2])
			i += 2
		}
	}
	return string(b)
}

func lowerHex(c byte) byte {
	if c >= 'A' && c <= 'F' {
		return c + 'a' - 'A'
	}
	return c
}

// jsonForms returns v as the inside of a JSON string, as encoders write it.
func jsonForms(v string) []string {
	var out []string
	for _, html := range []bool{true, false} {
		s := jsonString(v, html)
		for _, t := range []string{s, strings.ReplaceAll(s, "/", `\/`)} {
			out = append(out, t, upperUnicodeEscapes(t), escapeRunes(t, false, false), escapeRunes(t, true, false))
		}
	}
	return out
}

// jsonString is encoding/json's rendering of v without the quotes.
func jsonString(v string, escapeHTML bool) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(v) // a string always encodes
	s := strings.TrimSuffix(buf.String(), "\n")
	return s[1 : len(s)-1]
}

// upperUnicodeEscapes upper-cases the hex digits of each \uXXXX escape.
func upperUnicodeEscapes(s string) string {
	b := []byte(s)
	for i := 0; i+5 < len(b); i++ {
		if b[i] == '\\' && b[i+1] == 'u' {
			copy(b[i+2:i+6], strings.ToUpper(string(b[i+2:i+6])))
			i += 5
		} else if b[i] == '\\' {
			i++ // skip the escaped character, e.g. the second '\' of "\\u"
		}
	}
	return string(b)
}

// escapeRunes writes runes of s as JSON \uXXXX escapes (UTF-16, surrogate
// pairs above the BMP), in upper- or lower-case hex: the non-ASCII ones
// (Python's ensure_ascii), or with all every one.
func escapeRunes(s string, upper, all bool) string {
	digits := "0123456789abcdef"
	if upper {
		digits = "0123456789ABCDEF"
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf && !all:
			b.WriteByte(byte(r))
		case r >= 0x10000:
			hi, lo := utf16.EncodeRune(r)
			writeU(&b, digits, hi)
			writeU(&b, digits, lo)
		default:
			writeU(&b, digits, r)
		}
	}
	return b.String()
}

func writeU(b *strings.Builder, digits string, r rune) {
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(digits[(r>>shift)&15])
	}
}
