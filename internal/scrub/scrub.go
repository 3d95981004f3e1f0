// Package scrub masks injected secret values, in every common encoding, in
// response bytes: it is pure (no I/O of its own, no HTTP).
//
// Invariant: each occurrence of any form of a compiled value (raw, upper and
// lower case, base64, base64url, MIME base64, base32, percent, JSON escapes,
// HTML escapes, hex, UTF-16; see forms), and of any spelling with some of its
// characters escaped and others not (flex.go), is replaced in place by a
// same-length run of '*', escape sequences included, so lengths and framing hold;
// overlapping occurrences are all masked. Streaming keeps streaming: a Reader
// holds back only the bytes that could still be the start of a match, never a
// whole body, and never a fixed window.
//
// Not covered (scrubbing stops echoes, not an upstream set on leaking): other
// transforms of a value (reversed, cut, mixed case, base64 of base64, MIME
// base64 of a value inside a longer encoded text, where the line breaks fall
// elsewhere, base32 inside a longer base32 text, hex of every byte mixing
// upper and lower case in one occurrence, escapes applied twice, UTF-16 of
// anything but the value alone), partial escapes of a value with no run of
// flexMinRun letters and digits, of its letters and digits, or of a
// non-ASCII character as one (an HTML or \u reference), values shorter than
// MinLen, and, in a fragmented WebSocket message, up to MinLen-1 bytes
// before a frame boundary (see WebSocket).
//
// Matcher. Compile builds one multi-pattern Aho-Corasick DFA
// (github.com/coregx/ahocorasick, overlapping search) over the first anchorLen
// bytes of every form and of each flexible value's anchor (flex.go), each hit
// verified against the whole form or flexibly outward, and a gram
// prefilter in front of it (prefilter.go) that keeps the DFA to the few regions
// of a body where an anchor can be. BenchmarkMatcher compares them:
// bytes.Index once per form makes one pass per form, so its cost grows with
// the count; the DFA alone costs one dependent table load per byte whatever
// the count; the prefiltered DFA runs on a small fraction of the bytes and is
// several times faster again. The library's own
// prefilter (first bytes, via bytes.IndexByte) is only in IsMatch and Find,
// and barely skips with dozens of first bytes, all common in text.
//
// A Set is compiled per set of values and is immutable: its owner keeps it for
// as long as the values hold (the proxy's injector per entry, its placeholder
// replacer for the environment_variable values) and Join combines them per
// request, rather than compiling per request, since building the DFA costs far
// more than scanning a small body (BenchmarkCompile).
//
// Where the proxy uses it: Join to mask what several Sets mask (compiled
// apart, scanned together); String for the status text, each header and
// trailer value; DecodeReader then Reader for a body (re-encode, or deliver
// identity without Content-Encoding), and Container, DecodeReader, Reader
// and EncodeReader for a compressed container (container.go); WebSocket for the server-to-client
// stream of an upgrade, after removing Sec-WebSocket-Extensions from the
// client's request (see ErrWebSocketExtension). A Reader returns what it can
// release as soon as it has read it, so the proxy should flush its client
// writer after each Read to keep SSE and chunked streams live.
package scrub

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/coregx/ahocorasick"
)

// Mask is the byte every masked byte becomes.
const Mask = '*'

// anchorLen is how much of each form the DFA matches: a hit on a form's
// first anchorLen bytes is then verified against the whole form. It bounds
// the DFA by the number of forms, not their length: a long bearer JWT's forms
// as whole DFA patterns make a DFA far larger and slow to compile. 32 bytes of a form are as specific as all
// of it in practice, so verification runs only where there is a secret.
const anchorLen = 32

// Set holds the compiled patterns for a set of secret values. It is
// immutable and safe for concurrent use. The zero value and nil match nothing.
// Its String, GoString and MarshalJSON never render a value.
type Set struct {
	parts    []*matcher // one per Compile joined in (Join); none: matches nothing
	maxLen   int        // the longest pattern of any part
	minLen   int        // the shortest pattern: nothing shorter can hold a match
	skipped  int
	patterns int
}

// matcher is one compiled set of forms: what Compile builds.
type matcher struct {
	ac       *ahocorasick.Automaton // over the anchors: each form's first anchorLen bytes
	pre      *prefilter             // where the anchors may be; nil: everywhere
	byAnchor [][]int                // anchor pattern ID -> indexes into forms
	forms    [][]byte               // every form, deduplicated
	flexBy   [][]flexHit            // anchor pattern ID -> flexible values it anchors
	flex     []flexValue            // the values matched flexibly (flex.go)
	flexHead [256]bool              // first bytes of the flexible spellings
	flexPair *pairSet               // first two bytes of the flexible spellings
	sorted   [][]byte               // forms, sorted, for prefix checks
	first    [256]bool              // first bytes of patterns
	pair     *pairSet               // first two bytes of patterns
	maxLen   int
}

// Compile builds the Set for values: each value and the values derived from
// it (the credentials after an auth scheme; for Basic the decoded
// user:password and the password), in every form. Values shorter than MinLen
// are not scrubbed on their own (Skipped counts them). No values, or none long
// enough, give a Set that matches nothing (Active reports false).
func Compile(values ...string) *Set {
	s := &Set{}
	pats, flex := s.collect(values)
	if len(pats) == 0 {
		return s
	}
	m := &matcher{forms: pats, flex: flex}
	anchors := m.anchors()
	ac, err := ahocorasick.NewBuilder().AddPatterns(anchors).Build()
	if err != nil {
		// Build fails only without patterns; fail closed all the same: a
		// Set that cannot match must not pass for one that scrubs.
		panic("scrub: building the matcher failed: " + err.Error())
	}
	m.ac = ac
	m.pre = newPrefilter(anchors)
	s.minLen = m.index()
	s.parts, s.maxLen, s.patterns = []*matcher{m}, m.maxLen, len(pats)
	return s
}

// Join returns the Set that masks what any of sets masks, without compiling
// anything: the proxy joins the Set of every environment_variable value,
// compiled once per credential change, with the Set of one entry's injected
// values, so neither is compiled per request or once per entry. Each part
// scans the bytes on its own, so a join costs the sum of its parts' scans. A
// join of one active Set is that Set.
func Join(sets ...*Set) *Set {
	var one *Set
	n := 0
	for _, s := range sets {
		if s.Active() {
			one, n = s, n+1
		}
	}
	switch n {
	case 0:
		return nil
	case 1:
		return one // no allocation: the common case, one of the two empty
	}
	j := &Set{minLen: one.minLen}
	for _, s := range sets {
		if s.Active() {
			j.parts = append(j.parts, s.parts...)
			j.maxLen, j.minLen = max(j.maxLen, s.maxLen), min(j.minLen, s.minLen)
			j.skipped += s.skipped
			j.patterns += s.patterns
		}
	}
	return j
}

// anchors returns the distinct anchors of m.forms and fills byAnchor.
func (m *matcher) anchors() [][]byte {
	ids := map[string]int{}
	var out [][]byte
	for i, f := range m.forms {
		a := f[:min(len(f), anchorLen)]
		id, ok := ids[string(a)]
		if !ok {
			id = len(out)
			ids[string(a)] = id
			out = append(out, a)
			m.byAnchor = append(m.byAnchor, nil)
		}
		m.byAnchor[id] = append(m.byAnchor[id], i)
	}
	m.flexBy = make([][]flexHit, len(out))
	for i, f := range m.flex {
		for _, a := range f.anchors {
			id, ok := ids[a.s]
			if !ok {
				id = len(out)
				ids[a.s] = id
				out = append(out, []byte(a.s))
				m.byAnchor, m.flexBy = append(m.byAnchor, nil), append(m.flexBy, nil)
			}
			m.flexBy[id] = append(m.flexBy[id], flexHit{i, a.off})
		}
	}
	return out
}

// flexHit is a flexible value an anchor belongs to: m.flex[i], whose run
// starts off bytes into the anchor.
type flexHit struct{ i, off int }

// span is one occurrence, b[start:end].
type span struct{ start, end int }

// find appends every occurrence of a form in b (overlapping ones included)
// to out. An occurrence found twice (a value in two parts of a join, a
// spelling that is both a form and a flexible match) is reported once.
func (s *Set) find(b []byte, out []span) []span {
	if len(b) < s.minLen { // most header names and values
		return out
	}
	from := len(out)
	for _, m := range s.parts {
		out = m.find(b, out)
	}
	if len(out)-from > 1 {
		found := out[from:]
		slices.SortFunc(found, func(a, b span) int { return cmp.Or(a.start-b.start, a.end-b.end) })
		out = append(out[:from], slices.Compact(found)...)
	}
	return out
}

// find appends m's occurrences in b: each anchor hit whose whole form is
// there, the DFA running only on the regions the prefilter leaves.
func (m *matcher) find(b []byte, out []span) []span {
	if m.pre == nil {
		return m.findIn(b, 0, len(b), out)
	}
	m.pre.regions(b, func(lo, hi int) { out = m.findIn(b, lo, hi, out) })
	return out
}

// findIn appends the occurrences whose anchor lies in b[lo:hi]; the rest
// of the form may run past hi.
func (m *matcher) findIn(b []byte, lo, hi int, out []span) []span {
	for _, h := range m.ac.FindAllOverlapping(b[lo:hi]) {
		start, anchorEnd := lo+h.Start, lo+h.End
		for _, i := range m.byAnchor[h.PatternID] {
			f := m.forms[i]
			if end := start + len(f); end <= len(b) && bytes.Equal(b[anchorEnd:end], f[h.End-h.Start:]) {
				out = append(out, span{start, end})
			}
		}
		for _, fh := range m.flexBy[h.PatternID] {
			f := &m.flex[fh.i]
			out = f.find(b, start+fh.off, start+fh.off+f.n, out)
		}
	}
	return out
}

// collect returns the deduplicated forms of every value at least MinLen
// long, and the values also matched flexibly.
func (s *Set) collect(vals []string) ([][]byte, []flexValue) {
	seen := map[string]bool{}
	var pats [][]byte
	var flex []flexValue
	flexSeen := map[string]bool{}
	for _, v := range vals {
		for _, d := range values(v) {
			if len(d) < MinLen {
				s.skipped++
				continue
			}
			if f, ok := newFlexValue(d); ok && !flexSeen[d] {
				flexSeen[d] = true
				flex = append(flex, f)
			}
			for _, f := range forms(d) {
				if f != "" && !seen[f] {
					seen[f] = true
					pats = append(pats, []byte(f))
				}
			}
		}
	}
	return pats, flex
}

// index fills the prefix-check tables used to size the hold-back, and
// returns the shortest form's length.
func (m *matcher) index() int {
	m.sorted = slices.Clone(m.forms)
	slices.SortFunc(m.sorted, bytes.Compare)
	m.pair, m.flexPair = new(pairSet), new(pairSet)
	minLen := len(m.forms[0])
	for _, p := range m.forms {
		m.maxLen, minLen = max(m.maxLen, len(p)), min(minLen, len(p))
		m.first[p[0]] = true
		if len(p) > 1 {
			m.pair.add(p[0], p[1])
		}
	}
	for _, f := range m.flex {
		m.maxLen = max(m.maxLen, f.maxLen)
		for c, ok := range f.head {
			m.flexHead[c] = m.flexHead[c] || ok
		}
		f.pairs(m.flexPair)
	}
	return minLen
}

// pairSet is a set of byte pairs, as a bitmap.
type pairSet [1 << 16 / 64]uint64

func (p *pairSet) add(a, b byte) {
	k := int(a)<<8 | int(b)
	p[k/64] |= 1 << (k % 64)
}

func (p *pairSet) has(a, b byte) bool {
	k := int(a)<<8 | int(b)
	return p[k/64]&(1<<(k%64)) != 0
}

// Active reports whether s masks anything.
func (s *Set) Active() bool { return s != nil && len(s.parts) > 0 }

// Patterns returns the number of distinct patterns (forms) s matches.
func (s *Set) Patterns() int {
	if s == nil {
		return 0
	}
	return s.patterns
}

// Skipped returns how many values (given or derived) were shorter than
// MinLen and so are not scrubbed on their own.
func (s *Set) Skipped() int {
	if s == nil {
		return 0
	}
	return s.skipped
}

// MaxLen returns the length of the longest pattern: a Reader never holds
// back more than MaxLen-1 bytes.
func (s *Set) MaxLen() int {
	if s == nil {
		return 0
	}
	return s.maxLen
}

// Redacted renders s without any value: the pattern count only.
func (s *Set) Redacted() string {
	return "scrub.Set{patterns: " + strconv.Itoa(s.Patterns()) + ", values: redacted}"
}

// Format makes every fmt verb (%v, %+v, %s, %q, ...) print Redacted: String
// is the masking method below, not a fmt.Stringer, so without Format fmt
// would print the patterns.
func (s *Set) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.Redacted()) }

// GoString redacts like Redacted.
func (s *Set) GoString() string { return s.Redacted() }

// MarshalJSON redacts (zerolog and encoding/json use it).
func (s *Set) MarshalJSON() ([]byte, error) {
	return []byte(`{"patterns":` + strconv.Itoa(s.Patterns()) + `,"values":"redacted"}`), nil
}

// String returns a masked copy of v (a header value, status text, trailer)
// and the number of occurrences replaced. It is not a fmt.Stringer (see
// Format).
func (s *Set) String(v string) (string, int) {
	if !s.Active() || len(v) == 0 {
		return v, 0
	}
	b := []byte(v)
	n := s.mask(b)
	if n == 0 {
		return v, 0
	}
	return string(b), n
}

// Bytes masks b in place and returns the number of occurrences replaced.
func (s *Set) Bytes(b []byte) int {
	if !s.Active() {
		return 0
	}
	return s.mask(b)
}

// mask masks every occurrence in b and returns how many there were.
func (s *Set) mask(b []byte) int {
	occ := s.find(b, nil)
	for _, o := range occ {
		for i := o.start; i < o.end; i++ {
			b[i] = Mask
		}
	}
	return len(occ)
}
