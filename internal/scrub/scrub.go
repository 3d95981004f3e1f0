// Package scrub masks injected secret values, in every common encoding, in
// response bytes: it is pure (no I/O of its own, no HTTP).
//
// Invariant: each occurrence of any form of a compiled value (raw, base64,
// base64url, percent, JSON escapes, HTML escapes, hex; see forms) is replaced
// in place by a same-length run of '*', so lengths and framing hold;
// overlapping occurrences are all masked. Streaming keeps streaming: a Reader
// holds back only the bytes that could still be the start of a match, never a
// whole body, and never a fixed window.
//
// Not covered (scrubbing stops echoes, not an upstream set on leaking): other
// transforms of a value (reversed, re-cased, cut, base64 of base64, MIME base64
// with line breaks, hex or percent escapes mixing upper and lower case in one
// occurrence), values shorter than MinLen, and, in a fragmented WebSocket
// message, up to MinLen-1 bytes before a frame boundary (see WebSocket).
//
// Matcher. Compile builds one multi-pattern Aho-Corasick DFA
// (github.com/coregx/ahocorasick, overlapping search) over the first anchorLen
// bytes of every form, each hit verified against the whole form, and a gram
// prefilter in front of it (prefilter.go) that keeps the DFA to the few regions
// of a body where an anchor can be. Measured with BenchmarkMatcher (3
// credentials: 98 forms, the longest 141 bytes; a 1 MiB body of text over the
// base64, hex and percent alphabets) on this project's shared 2-core machine,
// per CPU second: bytes.Index once per form 30 MB/s (one pass per form: its
// cost grows with the count); the DFA alone 340-410 MB/s whatever the count
// (one dependent table load per byte); the prefiltered DFA 1.7-2.0 GB/s (it
// runs on 1% of the bytes; the samples are the rest). The library's own
// prefilter (first bytes, via bytes.IndexByte) is only in IsMatch and Find,
// and barely skips with dozens of first bytes, all common in text.
//
// A Set is compiled per set of values and is immutable: get it from a Cache
// (one per proxy) rather than compiling per request, since building the DFA
// costs far more than scanning a small body (BenchmarkCompile: ~3 ms of CPU for
// 3 credentials).
//
// Where the proxy uses it: String for the status text, each header and
// trailer value; DecodeReader then Reader for a body (re-encode, or deliver
// identity without Content-Encoding); WebSocket for the server-to-client
// stream of an upgrade, after removing Sec-WebSocket-Extensions from the
// client's request (see ErrWebSocketExtension). A Reader returns what it can
// release as soon as it has read it, so the proxy should flush its client
// writer after each Read to keep SSE and chunked streams live.
package scrub

import (
	"bytes"
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
// the DFA by the number of forms, not their length: a 2 KB bearer JWT's forms
// as whole DFA patterns made 64,000 states, 16 MiB and 0.4 s of compiling;
// anchored, they are ~700 states. 32 bytes of a form are as specific as all
// of it in practice, so verification runs only where there is a secret.
const anchorLen = 32

// Set holds the compiled patterns for a set of secret values. It is
// immutable and safe for concurrent use. The zero value and nil match nothing.
// Its String, GoString and MarshalJSON never render a value.
type Set struct {
	ac       *ahocorasick.Automaton // over the anchors: each form's first anchorLen bytes
	pre      *prefilter             // where the anchors may be; nil: everywhere
	byAnchor [][]int                // anchor pattern ID -> indexes into forms
	forms    [][]byte               // every form, deduplicated
	sorted   [][]byte               // forms, sorted, for prefix checks
	first    [256]bool              // first bytes of patterns
	pair     *[1 << 16 / 64]uint64  // first two bytes of patterns, as a bitmap
	maxLen   int
	minLen   int // the shortest pattern: nothing shorter can hold a match
	skipped  int
	patterns int
}

// Compile builds the Set for values: each value and the values derived from
// it (the credentials after an auth scheme; for Basic the decoded
// user:password and the password), in every form. Values shorter than MinLen
// are not scrubbed on their own (Skipped counts them). No values, or none long
// enough, give a Set that matches nothing (Active reports false).
func Compile(values ...string) *Set {
	s := &Set{}
	pats := s.collect(values)
	if len(pats) == 0 {
		return s
	}
	s.forms = pats
	anchors := s.anchors()
	ac, err := ahocorasick.NewBuilder().AddPatterns(anchors).Build()
	if err != nil {
		// Build fails only without patterns; fail closed all the same: a
		// Set that cannot match must not pass for one that scrubs.
		panic("scrub: building the matcher failed: " + err.Error())
	}
	s.ac = ac
	s.pre = newPrefilter(anchors)
	s.index(pats)
	return s
}

// anchors returns the distinct anchors of s.forms and fills byAnchor.
func (s *Set) anchors() [][]byte {
	ids := map[string]int{}
	var out [][]byte
	for i, f := range s.forms {
		a := f[:min(len(f), anchorLen)]
		id, ok := ids[string(a)]
		if !ok {
			id = len(out)
			ids[string(a)] = id
			out = append(out, a)
			s.byAnchor = append(s.byAnchor, nil)
		}
		s.byAnchor[id] = append(s.byAnchor[id], i)
	}
	return out
}

// span is one occurrence, b[start:end].
type span struct{ start, end int }

// find appends every occurrence of a form in b (overlapping ones included)
// to out: each anchor hit whose whole form is there, the DFA running only on
// the regions the prefilter leaves.
func (s *Set) find(b []byte, out []span) []span {
	if len(b) < s.minLen { // most header names and values
		return out
	}
	if s.pre == nil {
		return s.findIn(b, 0, len(b), out)
	}
	s.pre.regions(b, func(lo, hi int) { out = s.findIn(b, lo, hi, out) })
	return out
}

// findIn appends the occurrences whose anchor lies in b[lo:hi]; the rest
// of the form may run past hi.
func (s *Set) findIn(b []byte, lo, hi int, out []span) []span {
	for _, m := range s.ac.FindAllOverlapping(b[lo:hi]) {
		start, anchorEnd := lo+m.Start, lo+m.End
		for _, i := range s.byAnchor[m.PatternID] {
			f := s.forms[i]
			if end := start + len(f); end <= len(b) && bytes.Equal(b[anchorEnd:end], f[m.End-m.Start:]) {
				out = append(out, span{start, end})
			}
		}
	}
	return out
}

// collect returns the deduplicated forms of every value at least MinLen long.
func (s *Set) collect(vals []string) [][]byte {
	seen := map[string]bool{}
	var pats [][]byte
	for _, v := range vals {
		for _, d := range values(v) {
			if len(d) < MinLen {
				s.skipped++
				continue
			}
			for _, f := range forms(d) {
				if f != "" && !seen[f] {
					seen[f] = true
					pats = append(pats, []byte(f))
				}
			}
		}
	}
	return pats
}

// index fills the prefix-check tables used to size the hold-back.
func (s *Set) index(pats [][]byte) {
	s.patterns = len(pats)
	s.sorted = slices.Clone(pats)
	slices.SortFunc(s.sorted, bytes.Compare)
	s.pair = new([1 << 16 / 64]uint64)
	s.minLen = len(pats[0])
	for _, p := range pats {
		s.maxLen, s.minLen = max(s.maxLen, len(p)), min(s.minLen, len(p))
		s.first[p[0]] = true
		if len(p) > 1 {
			k := int(p[0])<<8 | int(p[1])
			s.pair[k/64] |= 1 << (k % 64)
		}
	}
}

// Active reports whether s masks anything.
func (s *Set) Active() bool { return s != nil && s.ac != nil }

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
