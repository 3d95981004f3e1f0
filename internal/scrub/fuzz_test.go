package scrub

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// FuzzReader holds the streaming Reader and Set.Bytes to the reference (mask
// every occurrence of every form with bytes.Index, the whole buffer at hand) at
// every split point of the body into two reads, and at one fuzz-chosen second
// split: no false negative, no false positive, the same count. The body is the
// fuzzed bytes with a fuzz-chosen form of the secret inserted (any of forms';
// testdata/fuzz/FuzzReader has a seed for each of the case, base32, UTF-16,
// every-character \u and MIME forms, and partial escapes), and one of a second value when that is
// long enough (its forms are in the same Set, so the prefilter's sampling step
// is the shorter value's and its grams are both values'), so matches are the
// common case.
func FuzzReader(f *testing.F) {
	f.Add("sk-live-0123456789abcdefXYZ/+=", "", []byte("echo: {} tail"), uint8(0), uint16(6), uint16(0), uint16(3))
	f.Add("Bearer tok_0123456789abcdef", "pass1234", []byte("data: x\n\ndata: y\n\n"), uint8(7), uint16(9), uint16(2), uint16(1))
	f.Add("aaaaaaaaab", "aaaaaaaab", []byte("aaaaaaaaaaaaaaaaaaaaab"), uint8(1), uint16(0), uint16(8), uint16(5))
	f.Add("Basic c3ZjLWRlcGxveTpacTghdlQyI21XeDlAcExyNA==", "AKIA-7f3b9c1e5d2a4f6b8c0e1d3f5a7b9c2e",
		[]byte(strings.Repeat("x", 300)), uint8(40), uint16(100), uint16(140), uint16(150))
	// Partial escapes of values whose longest run is short, so their anchors
	// are the run's extensions: over the bytes after it, and both sides.
	f.Add("svc-deploy:Zq8!vT2#mWx9@pLr4", "", []byte("echo: {} tail"), uint8(57), uint16(6), uint16(0), uint16(3))
	f.Add("sk_live_51Hx+Q2eRtY/uIop9As+dF", "", []byte("a&#43;b%2"), uint8(58), uint16(3), uint16(0), uint16(7))
	f.Fuzz(func(t *testing.T, secret, other string, body []byte, form uint8, at, at2, second uint16) {
		if len(secret) < MinLen || len(secret) > 128 || len(other) > 128 || len(body) > 512 {
			return
		}
		s := Compile(secret, other)
		if !s.Active() {
			t.Fatalf("a %d-byte value gave an inactive Set", len(secret))
		}
		body = insert(body, append(forms(secret), partialSpellings(secret)...), int(form), int(at))
		if len(other) >= MinLen {
			body = insert(body, append(forms(other), partialSpellings(other)...), int(form)/3, int(at2))
		}
		want, wantN := refMask(s, body)
		if wantN == 0 {
			t.Fatalf("the reference missed the inserted form")
		}
		if got := bytes.Clone(body); s.Bytes(got) != wantN || !bytes.Equal(got, want) {
			t.Fatalf("Bytes: got %q, want %q (%d)", got, want, wantN)
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

// partialSpellings returns spellings of v with each character but letters
// and digits raw or escaped, a different mix of escapes in each (picked from
// flex.go's table), after forms' in FuzzReader's index.
func partialSpellings(v string) []string {
	var out []string
	for k := range 4 {
		var b strings.Builder
		for i := 0; i < len(v); i++ {
			ss := spell[v[i]]
			b.WriteString(ss[(i*k+k)%len(ss)])
		}
		out = append(out, b.String())
	}
	return out
}

// insert returns body with fs[form % len(fs)] inserted at at % (len(body)+1).
func insert(body []byte, fs []string, form, at int) []byte {
	pos := at % (len(body) + 1)
	return append(body[:pos:pos], append([]byte(fs[form%len(fs)]), body[pos:]...)...)
}

// FuzzWebSocket holds the WebSocket Reader to its documented guarantee on
// a message fragmented at two fuzzed points (masked frames or not, delivered
// in two reads): frames keep their headers and lengths; against the
// reference over the whole message, a byte may differ only just before the
// end of a frame whose message continues — left unmasked within MinLen-1
// bytes of it, or masked speculatively within the longest pattern. The raw
// input is also fed as a stream of frames: errors, never a panic.
func FuzzWebSocket(f *testing.F) {
	f.Add("sk-live-0123456789abcdefXYZ/+=", []byte("say  done"), uint16(4), uint16(12), uint16(7), true, []byte{0x81, 0x02, 'h', 'i'})
	f.Add("Bearer tok_0123456789abcdef", []byte(`{"a":""}`), uint16(20), uint16(30), uint16(0), false, []byte{0x82, 0x7e, 0x00})
	f.Fuzz(func(t *testing.T, secret string, payload []byte, at, cut uint16, split uint16, masked bool, raw []byte) {
		if len(secret) < MinLen || len(secret) > 64 || len(payload) > 512 {
			return
		}
		s := Compile(secret)
		_, _ = io.ReadAll(s.WebSocket(bytes.NewReader(raw)))
		fs := forms(secret)
		pos := int(at) % (len(payload) + 1)
		msg := append(payload[:pos:pos], append([]byte(fs[int(at)%len(fs)]), payload[pos:]...)...)
		c1 := int(cut) % (len(msg) + 1)
		c2 := c1 + int(split)%(len(msg)-c1+1)
		var key []byte
		if masked {
			key = []byte{byte(at), byte(cut), 0x5a, byte(split)}
		}
		in := wsStream(wsFrame{op: 2, key: key, payload: msg[:c1]}, wsFrame{op: 0, key: key, payload: msg[c1:c2]},
			wsFrame{fin: true, op: 0, key: key, payload: msg[c2:]})
		out, _, err := wsRun(t, s, splitAt(in, int(split)%(len(in)+1))...)
		if err != nil || len(out) != len(in) {
			t.Fatalf("%d of %d bytes, %v", len(out), len(in), err)
		}
		var got []byte
		for _, fr := range parseFrames(t, out) {
			got = append(got, fr.payload...)
		}
		want, _ := refMask(s, msg)
		for i := range msg {
			if got[i] == want[i] {
				continue
			}
			limit := s.MaxLen() - 1
			if got[i] != Mask {
				limit = MinLen - 1
			}
			if !nearEnd(i, limit, c1, c2) {
				t.Fatalf("byte %d: got %q, want %q (frames end at %d, %d)", i, got, want, c1, c2)
			}
		}
	})
}

// nearEnd reports whether i lies within limit bytes before one of ends.
func nearEnd(i, limit int, ends ...int) bool {
	for _, e := range ends {
		if i < e && i >= e-limit {
			return true
		}
	}
	return false
}
