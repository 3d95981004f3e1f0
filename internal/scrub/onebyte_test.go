package scrub

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestOneByteReads: an upstream that trickles its reflection one byte per read
// (each read shorter than every pattern) still has every form masked.
func TestOneByteReads(t *testing.T) {
	for _, v := range testValues {
		s := Compile(v, "second-value-0123456789abcdef")
		for _, c := range encodedCases(v) {
			t.Run(c.name, func(t *testing.T) {
				b, err := io.ReadAll(s.Reader(iotest.OneByteReader(strings.NewReader(c.body))))
				if err != nil {
					t.Fatal(err)
				}
				assertMasked(t, c.body, string(b), c.at, c.n)
			})
		}
	}
}
