package scrub

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// refMask is the reference the streaming Reader is held to: with the whole
// buffer at hand, find every occurrence of every pattern with bytes.Index
// (overlaps included) and mask the union. It returns the masked copy and the
// number of occurrences. It is also the stdlib matcher BenchmarkMatcher
// measures against the DFA.
func refMask(s *Set, body []byte) ([]byte, int) {
	out := bytes.Clone(body)
	if !s.Active() {
		return out, 0
	}
	hit := make([]bool, len(body))
	found := map[span]bool{}
	for _, p := range s.allForms() {
		for i := 0; i <= len(body)-len(p); {
			j := bytes.Index(body[i:], p)
			if j < 0 {
				break
			}
			found[span{i + j, i + j + len(p)}] = true
			i += j + 1
		}
	}
	for _, m := range s.parts {
		for _, f := range m.flex {
			refFlex(body, string(f.v), f.maxLen, found)
		}
	}
	n := len(found)
	for o := range found {
		for k := o.start; k < o.end; k++ {
			hit[k] = true
		}
	}
	for i, h := range hit {
		if h {
			out[i] = Mask
		}
	}
	return out, n
}

// allForms returns the distinct forms of every part of s.
func (s *Set) allForms() [][]byte {
	seen := map[string]bool{}
	var out [][]byte
	for _, m := range s.parts {
		for _, f := range m.forms {
			if !seen[string(f)] {
				seen[string(f)] = true
				out = append(out, f)
			}
		}
	}
	return out
}

// chunks is a source that returns its chunks one per Read, then EOF.
type chunks struct {
	parts [][]byte
	reads int
}

func (c *chunks) Read(p []byte) (int, error) {
	c.reads++
	for len(c.parts) > 0 && len(c.parts[0]) == 0 {
		c.parts = c.parts[1:]
	}
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	return n, nil
}

// splitAt cuts body at the given offsets (ascending).
func splitAt(body []byte, at ...int) [][]byte {
	var parts [][]byte
	prev := 0
	for _, a := range at {
		parts = append(parts, body[prev:a])
		prev = a
	}
	return append(parts, body[prev:])
}

// streamMask runs body through a Reader, delivered in parts.
func streamMask(t testing.TB, s *Set, parts [][]byte) ([]byte, int) {
	t.Helper()
	r := s.Reader(&chunks{parts: parts})
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("ReadAll: %v", err)
	}
	return out, r.Count()
}

// textBody returns n bytes of JSON-ish text over an alphabet that shares
// characters with base64, hex and percent forms (so the matcher works for
// its living), with no secret in it.
func textBody(n int, seed uint64) []byte {
	const alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/=%\\\" :,{}\n"
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = alpha[rng.IntN(len(alpha))]
	}
	return b
}

// refFlex adds to found every span of body that spells v with each
// character but letters and digits raw or escaped: for each occurrence of
// v's longest run of letters and digits, a regular expression of the
// spellings before it is tried on every start, one of those after it on
// every end, within maxLen of it (no spelling is longer).
func refFlex(body []byte, v string, maxLen int, found map[span]bool) {
	run := longestRun(v)
	at := strings.Index(v, run)
	before := regexp.MustCompile(`^` + refSpellings(v[:at]) + `$`)
	after := regexp.MustCompile(`^` + refSpellings(v[at+len(run):]) + `$`)
	for i := 0; ; {
		j := bytes.Index(body[i:], []byte(run))
		if j < 0 {
			return
		}
		p := i + j
		i = p + 1
		var starts, ends []int
		for s := max(0, p-maxLen); s <= p; s++ {
			if before.Match(body[s:p]) {
				starts = append(starts, s)
			}
		}
		for e := p + len(run); e <= min(len(body), p+maxLen); e++ {
			if after.Match(body[p+len(run) : e]) {
				ends = append(ends, e)
			}
		}
		for _, s := range starts {
			for _, e := range ends {
				found[span{s, e}] = true
			}
		}
	}
}

// longestRun is the first longest run of letters and digits in v.
func longestRun(v string) string {
	best := ""
	for _, r := range regexp.MustCompile(`[A-Za-z0-9]+`).FindAllString(v, -1) {
		if len(r) > len(best) {
			best = r
		}
	}
	return best
}

// refSpellings is a regular expression for the spellings of v: letters and
// digits raw, any other byte raw, percent- or \x-escaped, and an ASCII one
// also as \u00XX, an HTML numeric reference of up to six digits, or its
// named or short escape.
func refSpellings(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if isAlnum(c) {
			b.WriteByte(c)
			continue
		}
		alts := []string{regexp.QuoteMeta(string(c)), fmt.Sprintf(`(?i:%%%02x|\\x%02x)`, c, c)}
		if c < 0x80 {
			dec, hex := fmt.Sprint(c), fmt.Sprintf("%x", c)
			alts = append(alts, fmt.Sprintf(`(?i:\\u00%02x)`, c),
				fmt.Sprintf(`&#0{0,%d}%s;`, 6-len(dec), dec), fmt.Sprintf(`(?i:&#x0{0,%d}%s;)`, 6-len(hex), hex))
			switch c {
			case '&', '<', '>', '"', '\'':
				name := map[byte]string{'&': "amp", '<': "lt", '>': "gt", '"': "quot", '\'': "apos"}[c]
				alts = append(alts, "(?i:&"+name+";)")
			case ' ':
				alts = append(alts, `\+`)
			}
			if e, ok := map[byte]string{'"': `"`, '/': "/", '\\': `\\`, '\b': "b", '\f': "f", '\n': "n", '\r': "r", '\t': "t"}[c]; ok {
				alts = append(alts, `(?i:\\`+e+`)`)
			}
		}
		b.WriteString("(?:" + strings.Join(alts, "|") + ")")
	}
	return b.String()
}
