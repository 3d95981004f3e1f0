package scrub

import (
	"strconv"
	"strings"
)

// Partial escaping. Encoders escape some characters of a value and leave the
// rest raw: Go's html/template writes '+' as "&#43;" and nothing else of a
// base64 token, Python's quote() escapes '+' and '=' but not '/', .NET's JSON
// encoder writes '+' as "\u002B". A value with k such characters has 2^k
// spellings per encoder, too many to list as forms, so a value that holds any
// character but a letter or digit is also matched flexibly: each of those
// characters raw or as any of its escapes (spellings), its letters and digits
// raw, as every such encoder leaves them. The escapes of one occurrence may
// come from different families (an HTML page quoting JSON): accepting any mix
// matches a superset of each family's spellings at the same cost.
//
// Anchor and verify, as for forms: the DFA looks for the value's longest run
// of letters and digits (every spelling holds it raw), and a hit is verified
// outward from the run, byte by byte, against each byte's spellings, keeping
// every position a spelling can reach (a raw '%' and the "%25" that begins
// with it may both lead on).

// flexMinRun is the shortest run of letters and digits that anchors a
// flexible value: the prefilter's sampling step is the shortest anchor less
// gramLen-1, so the shortest run of any value sets the step for every body
// scanned with its Set: a shorter run than this would slow the scan to about
// the DFA's own speed and anchor on common words. A value whose runs are all
// shorter is matched in its whole-value forms only (docs/policy.md).
const flexMinRun = 6

// maxEntityDigits bounds the digits of a numeric character reference,
// leading zeros included ("&#x00002B;"): encoders pad to fixed widths, and
// the bound keeps the longest spelling, and so the hold-back, small.
const maxEntityDigits = 6

// flexValue is one value matched flexibly.
type flexValue struct {
	v      []byte
	at, n  int        // the anchor: v[at:at+n]
	maxLen int        // the longest spelling of v
	head   *[256]bool // first bytes of v's spellings
}

// spell[c] lists the spellings of byte c: c itself first (matched exactly),
// then its escapes (matched with ASCII case folded: "%2b", "&#X2B;").
var spell = spellings()

// spellMax[c] is the length of c's longest spelling.
var spellMax = func() (m [256]int) {
	for c, ss := range spell {
		for _, s := range ss {
			m[c] = max(m[c], len(s))
		}
	}
	return m
}()

// spellings builds spell.
func spellings() [256][]string {
	var t [256][]string
	for c := range 256 {
		b := byte(c)
		t[c] = []string{string(b)}
		if isAlnum(b) {
			continue
		}
		hex2 := strconv.FormatUint(uint64(c)|0x100, 16)[1:]
		t[c] = append(t[c], "%"+hex2, `\x`+hex2)
		if c >= 0x80 {
			continue // HTML and JSON escape runes, not bytes
		}
		t[c] = append(t[c], `\u00`+hex2)
		dec, hex := strconv.Itoa(c), strconv.FormatUint(uint64(c), 16)
		for pad := ""; len(pad)+len(dec) <= maxEntityDigits; pad += "0" {
			t[c] = append(t[c], "&#"+pad+dec+";")
		}
		for pad := ""; len(pad)+len(hex) <= maxEntityDigits; pad += "0" {
			t[c] = append(t[c], "&#x"+pad+hex+";")
		}
		if e, ok := namedEscapes[b]; ok {
			t[c] = append(t[c], e...)
		}
	}
	return t
}

// namedEscapes are the other escapes of a byte: HTML named entities, JSON's
// short escapes, and '+' for a space (form encoding).
var namedEscapes = map[byte][]string{
	'&': {"&amp;"}, '<': {"&lt;"}, '>': {"&gt;"}, '"': {"&quot;", `\"`}, '\'': {"&apos;"},
	'/': {`\/`}, '\\': {`\\`}, ' ': {"+"},
	'\b': {`\b`}, '\f': {`\f`}, '\n': {`\n`}, '\r': {`\r`}, '\t': {`\t`},
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// newFlexValue returns v as a flexible value, or false when its whole-value
// forms cover it (letters and digits only) or no run anchors it.
func newFlexValue(v string) (flexValue, bool) {
	if !strings.ContainsFunc(v, func(r rune) bool { return r >= 0x80 || !isAlnum(byte(r)) }) {
		return flexValue{}, false
	}
	f := flexValue{v: []byte(v)}
	for i := 0; i < len(v); {
		j := i
		for j < len(v) && isAlnum(v[j]) {
			j++
		}
		if j-i > f.n {
			f.at, f.n = i, j-i
		}
		i = j + 1
	}
	if f.n < flexMinRun {
		return flexValue{}, false
	}
	f.n = min(f.n, anchorLen)
	f.head = new([256]bool)
	for _, s := range spell[f.v[0]] {
		f.head[s[0]], f.head[lowerASCII(s[0])] = true, true
	}
	for _, c := range f.v {
		f.maxLen += spellMax[c]
	}
	return f, true
}

// anchor is the literal the DFA looks for.
func (f *flexValue) anchor() []byte { return f.v[f.at : f.at+f.n] }

// find appends the occurrences of f around an anchor hit at b[start:end]:
// every spelling start before it times every spelling end after it.
func (f *flexValue) find(b []byte, start, end int, out []span) []span {
	var sbuf, sscratch, ebuf, escratch [4]int
	starts := backward(b, start, f.v[:f.at], sbuf[:0], sscratch[:0])
	if len(starts) == 0 {
		return out
	}
	ends, _ := forward(b, end, f.v[f.at+f.n:], ebuf[:0], escratch[:0])
	for _, s := range starts {
		for _, e := range ends {
			out = append(out, span{s, e})
		}
	}
	return out
}

// startsSpelling reports whether b is a proper prefix of a spelling of f: a
// later read may complete it.
func (f *flexValue) startsSpelling(b []byte) bool {
	if !f.head[b[0]] {
		return false
	}
	var buf, scratch [4]int
	_, partial := forward(b, 0, f.v, buf[:0], scratch[:0])
	return partial
}

// forward returns the positions in b where a spelling of v starting at
// from ends (into dst or scratch), and whether one ran into the end of b
// unfinished.
func forward(b []byte, from int, v []byte, dst, scratch []int) (ends []int, partial bool) {
	cur, next := append(dst, from), scratch
	for _, c := range v {
		next = next[:0]
		for _, q := range cur {
			if q == len(b) {
				partial = true
				continue
			}
			for k, s := range spell[c] {
				switch {
				case q+len(s) <= len(b):
					if equalSpelling(b[q:q+len(s)], s, k == 0) {
						next = addPos(next, q+len(s))
					}
				case equalSpelling(b[q:], s[:len(b)-q], k == 0):
					partial = true
				}
			}
		}
		if len(next) == 0 {
			return nil, partial
		}
		cur, next = next, cur
	}
	return cur, partial
}

// backward returns the positions in b where a spelling of v ending at to
// starts (into dst or scratch).
func backward(b []byte, to int, v []byte, dst, scratch []int) []int {
	cur, next := append(dst, to), scratch
	for i := len(v) - 1; i >= 0; i-- {
		next = next[:0]
		for _, q := range cur {
			for k, s := range spell[v[i]] {
				if q >= len(s) && equalSpelling(b[q-len(s):q], s, k == 0) {
					next = addPos(next, q-len(s))
				}
			}
		}
		if len(next) == 0 {
			return nil
		}
		cur, next = next, cur
	}
	return cur
}

// addPos adds q to the set ps.
func addPos(ps []int, q int) []int {
	for _, p := range ps {
		if p == q {
			return ps
		}
	}
	return append(ps, q)
}

// equalSpelling reports whether b is s: exactly for the raw byte, with ASCII
// case folded for an escape.
func equalSpelling(b []byte, s string, exact bool) bool {
	if exact {
		return string(b) == s
	}
	for i := range len(b) {
		if lowerASCII(b[i]) != lowerASCII(s[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
