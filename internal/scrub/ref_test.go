package scrub

import (
	"bytes"
	"io"
	"math/rand/v2"
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
	n := 0
	for _, p := range s.allForms() {
		for i := 0; i <= len(body)-len(p); {
			j := bytes.Index(body[i:], p)
			if j < 0 {
				break
			}
			n++
			for k := i + j; k < i+j+len(p); k++ {
				hit[k] = true
			}
			i += j + 1
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
