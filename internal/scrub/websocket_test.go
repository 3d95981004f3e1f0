package scrub

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

// wsFrame is one frame as a test writes it (RFC 6455 section 5.2).
type wsFrame struct {
	fin     bool
	rsv     byte
	op      byte
	key     []byte // nil: unmasked
	payload []byte
}

// bytes renders f with the shortest length encoding.
func (f wsFrame) bytes() []byte {
	b0 := f.op | f.rsv<<4
	if f.fin {
		b0 |= 0x80
	}
	var mask byte
	if f.key != nil {
		mask = 0x80
	}
	out := []byte{b0}
	switch n := len(f.payload); {
	case n < 126:
		out = append(out, mask|byte(n))
	case n < 1<<16:
		out = append(out, mask|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, mask|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	out = append(out, f.key...)
	p := bytes.Clone(f.payload)
	for i := range p {
		if f.key != nil {
			p[i] ^= f.key[i%4]
		}
	}
	return append(out, p...)
}

// parseFrames splits a stream into frames (payloads unmasked).
func parseFrames(t *testing.T, b []byte) []wsFrame {
	t.Helper()
	var out []wsFrame
	for len(b) > 0 {
		f := wsFrame{fin: b[0]&0x80 != 0, rsv: b[0] >> 4 & 7, op: b[0] & 0xf}
		n, h := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			n, h = uint64(binary.BigEndian.Uint16(b[2:])), 4
		case 127:
			n, h = binary.BigEndian.Uint64(b[2:]), 10
		}
		if b[1]&0x80 != 0 {
			f.key = b[h : h+4]
			h += 4
		}
		f.payload = bytes.Clone(b[h : h+int(n)])
		for i := range f.payload {
			if f.key != nil {
				f.payload[i] ^= f.key[i%4]
			}
		}
		out = append(out, f)
		b = b[h+int(n):]
	}
	return out
}

func wsStream(frames ...wsFrame) []byte {
	var b []byte
	for _, f := range frames {
		b = append(b, f.bytes()...)
	}
	return b
}

// wsRun scrubs the stream delivered in parts and returns the output.
func wsRun(t *testing.T, s *Set, parts ...[]byte) ([]byte, int, error) {
	t.Helper()
	r := s.WebSocket(&chunks{parts: parts})
	out, err := io.ReadAll(r)
	return out, r.Count(), err
}

func TestWebSocketFrames(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	key := []byte{0xde, 0xad, 0xbe, 0xef}
	long := func(n int) []byte { return append(append(textBody(n/2, 1), v...), textBody(n-n/2-len(v), 2)...) }
	cases := []struct {
		name string
		f    wsFrame
	}{
		{"text unmasked", wsFrame{fin: true, op: 1, payload: []byte(`{"echo":"` + v + `"}`)}},
		{"binary masked", wsFrame{fin: true, op: 2, key: key, payload: []byte("\x00\x01" + v + "\xff")}},
		{"16-bit length", wsFrame{fin: true, op: 1, payload: long(1000)}},
		{"64-bit length masked", wsFrame{fin: true, op: 2, key: key, payload: long(70000)}},
		{"empty", wsFrame{fin: true, op: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.f.bytes()
			want, wantN := refMask(s, c.f.payload)
			step := max(1, len(in)/64)
			for i := 0; i <= len(in); i += step {
				out, n, err := wsRun(t, s, splitAt(in, i, (i+len(in))/2)...)
				if err != nil || len(out) != len(in) {
					t.Fatalf("%d bytes, %v; want %d", len(out), err, len(in))
				}
				if !bytes.Equal(out[:len(in)-len(c.f.payload)], in[:len(in)-len(c.f.payload)]) {
					t.Error("frame header changed")
				}
				got := parseFrames(t, out)
				if len(got) != 1 || !bytes.Equal(got[0].payload, want) || n != wantN {
					t.Fatalf("payload %q (%d), want %q (%d)", got[0].payload, n, want, wantN)
				}
			}
		})
	}
}

// TestWebSocketFragmented: a secret split across continuation frames, with
// a ping between them; the documented guarantee holds at every split point:
// the bytes after a frame boundary are masked; the bytes before it are
// masked when there are MinLen or more of them; at most MinLen-1 are not.
func TestWebSocketFragmented(t *testing.T) {
	v := testValues[0] // 30 bytes
	s := Compile(v)
	msg := []byte("say " + v + " done")
	at := 4 // where v starts in msg
	for cut := at; cut <= at+len(v); cut++ {
		in := wsStream(
			wsFrame{op: 1, payload: msg[:cut]},
			wsFrame{fin: true, op: 9, payload: []byte("ping-data")},
			wsFrame{fin: true, op: 0, payload: msg[cut:]},
		)
		out, n, err := wsRun(t, s, in)
		if err != nil || len(out) != len(in) {
			t.Fatalf("cut %d: %d bytes, %v", cut, len(out), err)
		}
		f := parseFrames(t, out)
		if len(f) != 3 || string(f[1].payload) != "ping-data" {
			t.Fatalf("cut %d: frames %+v", cut, f)
		}
		got := append(bytes.Clone(f[0].payload), f[2].payload...)
		head := cut - at
		for i := at; i < at+len(v); i++ {
			if got[i] != Mask && (i >= cut || head >= MinLen) {
				t.Errorf("cut %d: byte %d of the secret left unmasked: %q", cut, i-at, got)
				break
			}
		}
		if string(got[:at]) != "say " || string(got[at+len(v):]) != " done" || n != 1 {
			t.Errorf("cut %d: text around changed or count %d: %q", cut, n, got)
		}
	}
}

// TestWebSocketNoFrameWaits: a frame is released whole before the source
// is read again, even when it ends in the first bytes of a secret.
func TestWebSocketNoFrameWaits(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	f1 := wsFrame{op: 1, payload: []byte("chunk ends in " + v[:5])}.bytes()
	f2 := wsFrame{fin: true, op: 0, payload: []byte(v[5:])}.bytes()
	src := &chunks{parts: [][]byte{f1, f2}}
	r := s.WebSocket(src)
	got := make([]byte, len(f1))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	if src.reads != 1 {
		t.Fatalf("the first frame took %d source reads", src.reads)
	}
	if !bytes.Equal(got, f1) { // v[:5] < MinLen: released as it is
		t.Errorf("first frame changed: %q", got)
	}
	rest, _ := io.ReadAll(r)
	if p := parseFrames(t, rest)[0].payload; string(p) != strings.Repeat("*", len(v)-5) {
		t.Errorf("continuation not masked: %q", p)
	}
}

func TestWebSocketControlFrames(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	closing := append([]byte{0x03, 0xe8}, "bad token "+v...)
	in := wsStream(
		wsFrame{fin: true, op: 9, payload: []byte("hello")},
		wsFrame{fin: true, op: 10, key: []byte{1, 2, 3, 4}, payload: []byte("pong " + v)},
		wsFrame{fin: true, op: 8, payload: closing},
	)
	out, n, err := wsRun(t, s, in)
	if err != nil || len(out) != len(in) || n != 2 {
		t.Fatalf("%d bytes, %d, %v", len(out), n, err)
	}
	f := parseFrames(t, out)
	if string(f[0].payload) != "hello" || string(f[1].payload) != "pong "+strings.Repeat("*", len(v)) ||
		!bytes.Equal(f[2].payload[:2], []byte{0x03, 0xe8}) || strings.Contains(string(f[2].payload), v) {
		t.Errorf("control frames: %+v", f)
	}
}

func TestWebSocketRefusals(t *testing.T) {
	s := Compile(testValues[0])
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"permessage-deflate", wsFrame{fin: true, rsv: 4, op: 1, payload: []byte("x")}.bytes(), ErrWebSocketExtension},
		{"continuation first", wsFrame{fin: true, op: 0, payload: []byte("x")}.bytes(), ErrWebSocketFrame},
		{"new message inside one", wsStream(wsFrame{op: 1, payload: []byte("a")}, wsFrame{fin: true, op: 1}), ErrWebSocketFrame},
		{"unknown opcode", wsFrame{fin: true, op: 3}.bytes(), ErrWebSocketFrame},
		{"fragmented ping", wsFrame{op: 9}.bytes(), ErrWebSocketFrame},
		{"long ping", wsFrame{fin: true, op: 9, payload: make([]byte, 126)}.bytes(), ErrWebSocketFrame},
		{"huge length", []byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, ErrWebSocketFrame},
		{"cut mid payload", wsFrame{fin: true, op: 1, payload: []byte("0123456789")}.bytes()[:6], io.ErrUnexpectedEOF},
		{"cut mid header", []byte{0x81}, io.ErrUnexpectedEOF},
		{"cut mid message", wsFrame{op: 1, payload: []byte("a")}.bytes(), io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := wsRun(t, s, c.in)
			if !errors.Is(err, c.want) {
				t.Errorf("err = %v, want %v", err, c.want)
			}
		})
	}
}
