package scrub

import (
	"bytes"
	"testing"
)

// FuzzReader holds the streaming Reader to the reference (mask every
// occurrence with the whole buffer at hand) at every split point of the body
// into two reads, and at one fuzzed second split: no false negative, no
// false positive, the same count. The body is the fuzzed bytes with one
// fuzz-chosen form of the secret inserted, so matches are the common case.
func FuzzReader(f *testing.F) {
	f.Add("sk-live-0123456789abcdefXYZ/+=", []byte("echo: {} tail"), uint8(0), uint16(6), uint16(3))
	f.Add("Bearer tok_0123456789abcdef", []byte("data: x\n\ndata: y\n\n"), uint8(7), uint16(9), uint16(1))
	f.Add("aaaaaaaaab", []byte("aaaaaaaaaaaaaaaaaaaaab"), uint8(1), uint16(0), uint16(5))
	f.Fuzz(func(t *testing.T, secret string, body []byte, form uint8, at, second uint16) {
		if len(secret) < MinLen || len(secret) > 64 || len(body) > 512 {
			return
		}
		s := Compile(secret)
		if !s.Active() {
			t.Fatalf("a %d-byte value gave an inactive Set", len(secret))
		}
		fs := forms(secret)
		ins := fs[int(form)%len(fs)]
		pos := int(at) % (len(body) + 1)
		body = append(body[:pos:pos], append([]byte(ins), body[pos:]...)...)
		want, wantN := refMask(s, body)
		if wantN == 0 {
			t.Fatalf("the reference missed the inserted form %q", ins)
		}
		j := int(second) % (len(body) + 1)
		for i := 0; i <= len(body); i++ {
			got, n := streamMask(t, s, splitAt(body, min(i, j), max(i, j)))
			if !bytes.Equal(got, want) || n != wantN {
				t.Fatalf("split %d,%d: got %q (%d), want %q (%d)", i, j, got, n, want, wantN)
			}
		}
	})
}
