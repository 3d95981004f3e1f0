package scrub

import (
	"bytes"
	"testing"
)

// TestPrefilterEveryOffset puts each form at every offset of a sampling
// period (and at the end) of a text body: the prefilter must leave every one
// to the DFA, whatever its phase against the samples. Two Sets: a short and a
// long value (step set by the short one's forms), and a long value alone (all
// anchors anchorLen long: one sample inside each, at any of its grams, so the
// scanned region's bounds are exact).
func TestPrefilterEveryOffset(t *testing.T) {
	for _, s := range []*Set{Compile("pw-12345", benchValues[0]), Compile(benchValues[0])} {
		m := s.parts[0]
		if m.pre == nil || m.pre.step < minStep {
			t.Fatalf("no prefilter for anchors of %d bytes and more", MinLen)
		}
		text := textBody(3*s.MaxLen(), 5)
		for _, f := range m.forms {
			for _, at := range append(offsets(m.pre.step), len(text)-len(f)) {
				body := append(bytes.Clone(text[:at]), f...)
				body = append(body, text[at+len(f):]...)
				want, wantN := refMask(s, body)
				got := bytes.Clone(body)
				if n := s.Bytes(got); n != wantN || !bytes.Equal(got, want) {
					t.Fatalf("step %d: a %d-byte form at %d: %d occurrences, want %d", m.pre.step, len(f), at, n, wantN)
				}
			}
		}
	}
}

// offsets returns 0 to 2*step: every phase of a form against the samples.
func offsets(step int) []int {
	var out []int
	for i := 0; i <= 2*step; i++ {
		out = append(out, i)
	}
	return out
}

// TestPrefilterSkipsText: on text without a secret, the DFA sees a small
// fraction of the bytes (the prefilter is what makes 1 MiB cheap).
func TestPrefilterSkipsText(t *testing.T) {
	s := Compile(benchValues...)
	body := textBody(1<<20, 3)
	scanned := 0
	s.parts[0].pre.regions(body, func(lo, hi int) { scanned += hi - lo })
	if scanned > len(body)/20 {
		t.Errorf("the DFA scans %d of %d bytes", scanned, len(body))
	}
}
