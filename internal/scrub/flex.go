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
//
// A short run would make a short anchor, and the prefilter's sampling step
// follows the shortest anchor of a Set, so one short run would slow every
// body scanned with it. A run shorter than flexAnchorLen is therefore
// extended over its neighbours into several longer anchors: the run followed
// by each spelling of the next bytes (then preceded by each spelling of the
// bytes before it, once the value ends), each cut at flexAnchorLen bytes.
// Every spelling of the value holds one of them, so the anchors find what the
// run alone finds; the cut merges spellings that agree on their first bytes.

// flexMinRun is the shortest run of letters and digits that anchors a
// flexible value: a shorter run would anchor on common words, and where its
// extensions are bounded (maxFlexAnchors) the run itself is the anchor, whose
// length sets the prefilter's sampling step for every body scanned with its
// Set. A value whose runs are all shorter is matched in its whole-value forms
// only (docs/policy.md).
const flexMinRun = 6

// flexAnchorLen is how long a flexible value's anchors are made: long enough
// for the prefilter to sample every ten bytes; longer anchors multiply in
// number (each byte but a letter or digit they cross does) for little, as the
// samples then cost less than the regions the DFA still scans.
const flexAnchorLen = 13

// maxFlexAnchors bounds the anchors of one flexible value. Each byte but a
// letter or digit has a few dozen spellings (case variants included), so the
// count multiplies with every such byte the extension crosses: when it would
// pass the bound, the anchors are made a byte shorter, down to the run alone
// (one anchor). So the DFA stays small and its build fast whatever the value,
// and the prefilter's bitmap sparse when a Set holds many such values.
const maxFlexAnchors = 64

// maxEntityDigits bounds the digits of a numeric character reference,
// leading zeros included ("&#x00002B;"): encoders pad to fixed widths, and
// the bound keeps the longest spelling, and so the hold-back, small.
const maxEntityDigits = 6

// flexValue is one value matched flexibly.
type flexValue struct {
	v       []byte
	at, n   int          // the run: v[at:at+n]
	anchors []flexAnchor // what the DFA looks for, each holding the run
	maxLen  int          // the longest spelling of v
	head    *[256]bool   // first bytes of v's spellings
}

// flexAnchor is one anchor of a flexible value: the run starts off bytes in.
type flexAnchor struct {
	s   string
	off int
}

// spell[c] lists the spellings of byte c: c itself first (matched exactly),
// then its escapes (matched with ASCII case folded: "%2b", "&#X2B;").
var spell = spellings()

// spellFolded[c] lists the spellings of byte c as the DFA must see them:
// c itself, then every ASCII case variant of each escape.
var spellFolded = func() (t [256][]string) {
	for c, ss := range spell {
		seen := map[string]bool{}
		for k, s := range ss {
			vs := []string{s}
			if k > 0 {
				vs = caseVariants(s)
			}
			for _, v := range vs {
				if !seen[v] {
					seen[v] = true
					t[c] = append(t[c], v)
				}
			}
		}
	}
	return t
}()

// caseVariants returns s with its ASCII letters in every mix of cases.
func caseVariants(s string) []string {
	out := []string{""}
	for i := range len(s) {
		lo, up := strings.ToLower(s[i:i+1]), strings.ToUpper(s[i:i+1])
		n := len(out)
		for k := range n {
			if up != lo {
				out = append(out, out[k]+up)
			}
			out[k] += lo
		}
	}
	return out
}

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
	f.anchors = f.extend()
	f.head = new([256]bool)
	for _, s := range spell[f.v[0]] {
		f.head[s[0]], f.head[lowerASCII(s[0])] = true, true
	}
	for _, c := range f.v {
		f.maxLen += spellMax[c]
	}
	return f, true
}

// extend returns f's anchors: the run, extended to the longest length up to
// flexAnchorLen that keeps them within maxFlexAnchors.
func (f *flexValue) extend() []flexAnchor {
	for limit := flexAnchorLen; limit > f.n; limit-- {
		if as, ok := f.extendTo(limit); ok {
			return as
		}
	}
	return []flexAnchor{{string(f.v[f.at : f.at+f.n]), 0}}
}

// extendTo returns the anchors of f cut at limit bytes, or false when there
// would be more than maxFlexAnchors.
func (f *flexValue) extendTo(limit int) ([]flexAnchor, bool) {
	// Each partial anchor spells v[j:i], its run off bytes in.
	type partial struct {
		flexAnchor
		i, j int
	}
	cur := []partial{{flexAnchor{string(f.v[f.at : f.at+f.n]), 0}, f.at + f.n, f.at}}
	var done []flexAnchor
	for len(cur) > 0 {
		seen := map[partial]bool{}
		var next []partial
		add := func(p partial) {
			if !seen[p] {
				seen[p] = true
				next = append(next, p)
			}
		}
		for _, p := range cur {
			switch {
			case len(p.s) >= limit || p.i == len(f.v) && p.j == 0:
				done = append(done, p.flexAnchor)
			case p.i < len(f.v):
				for _, sp := range spellFolded[f.v[p.i]] {
					s := p.s + sp
					add(partial{flexAnchor{s[:min(len(s), limit)], p.off}, p.i + 1, p.j})
				}
			default:
				for _, sp := range spellFolded[f.v[p.j-1]] {
					s := sp + p.s
					cut := max(0, len(s)-limit)
					add(partial{flexAnchor{s[cut:], p.off + len(sp) - cut}, p.i, p.j - 1})
				}
			}
		}
		if len(done)+len(next) > maxFlexAnchors {
			return nil, false
		}
		cur = next
	}
	return done, true
}

// find appends the occurrences of f around a hit of its run at
// b[start:end]: every spelling start before it times every spelling end
// after it.
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

// pairs adds to ps the first two bytes of every spelling of f.
func (f *flexValue) pairs(ps *pairSet) {
	for _, s := range spellFolded[f.v[0]] {
		if len(s) > 1 {
			ps.add(s[0], s[1])
			continue
		}
		for _, t := range spellFolded[f.v[1]] {
			ps.add(s[0], t[0])
		}
	}
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
