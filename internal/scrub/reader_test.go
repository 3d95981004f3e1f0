package scrub

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net/url"
	"runtime"
	"strings"
	"testing"
)

// mixedBody holds several forms of testValues[0] back to back, overlapping
// forms of two values, and plain text between them.
func mixedBody() []byte {
	v := testValues[0]
	return []byte("HTTP echo: " + v + "\n" +
		`{"b":"` + base64.StdEncoding.EncodeToString([]byte(`{"t":"`+v+`"}`)) + `"}` + "\n" +
		"q=" + url.QueryEscape(v) + "&x=" + v[:10] + "\n" +
		"tail " + v[:len(v)-1])
}

// TestReaderEverySplit: every split of the body into two reads and a grid
// of three-read splits give exactly the reference output and count.
func TestReaderEverySplit(t *testing.T) {
	s := Compile(testValues...)
	body := mixedBody()
	want, wantN := refMask(s, body)
	if wantN < 3 {
		t.Fatalf("reference found %d occurrences; the body is wrong", wantN)
	}
	check := func(at ...int) {
		t.Helper()
		got, n := streamMask(t, s, splitAt(body, at...))
		if !bytes.Equal(got, want) || n != wantN {
			t.Fatalf("split %v: got %q (%d), want %q (%d)", at, got, n, want, wantN)
		}
	}
	for i := 0; i <= len(body); i++ {
		check(i)
		for j := i; j <= len(body); j += 3 {
			check(i, j)
		}
	}
}

// TestReaderByteAtATime feeds one byte per read.
func TestReaderByteAtATime(t *testing.T) {
	s := Compile(testValues...)
	body := mixedBody()
	var parts [][]byte
	for i := range body {
		parts = append(parts, body[i:i+1])
	}
	want, wantN := refMask(s, body)
	got, n := streamMask(t, s, parts)
	if !bytes.Equal(got, want) || n != wantN {
		t.Fatalf("got %q (%d), want %q (%d)", got, n, want, wantN)
	}
}

// TestReaderHoldsOnlyAPossibleStart: a read ending in the first bytes of a
// secret is released up to them, and an SSE event ending in "\n\n" is
// released whole by the Read that received it.
func TestReaderHoldsOnlyAPossibleStart(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	src := &chunks{parts: [][]byte{
		[]byte("data: {\"k\":\"" + v + "\"}\n\n"),
		[]byte("data: partial " + v[:12]),
		[]byte(v[12:] + " end\n\n"),
	}}
	r := s.Reader(src)
	buf := make([]byte, 1<<16)
	want := []string{
		"data: {\"k\":\"" + strings.Repeat("*", len(v)) + "\"}\n\n",
		"data: partial ",
		strings.Repeat("*", len(v)) + " end\n\n",
	}
	for i, w := range want {
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != w {
			t.Fatalf("read %d: %q, %v; want %q", i, buf[:n], err, w)
		}
		if src.reads != i+1 {
			t.Fatalf("read %d took %d source reads: bytes were held back", i, src.reads)
		}
	}
	if n, err := r.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the body: %d, %v", n, err)
	}
	if r.Count() != 2 {
		t.Errorf("Count = %d, want 2", r.Count())
	}
}

// TestReaderSmallReads: a caller with a tiny buffer still gets every byte.
func TestReaderSmallReads(t *testing.T) {
	s := Compile(testValues...)
	body := bytes.Repeat(mixedBody(), 50)
	want, _ := refMask(s, body)
	r := s.Reader(bytes.NewReader(body))
	var got []byte
	p := make([]byte, 7)
	for {
		n, err := r.Read(p)
		got = append(got, p[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("output differs from the reference")
	}
}

// failing returns its data, then a non-EOF error.
type failing struct{ data []byte }

func (f *failing) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, errors.New("connection reset")
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// TestReaderErrorDropsHeldPrefix: a body cut by an upstream error right
// inside a secret does not release the secret's first bytes.
func TestReaderErrorDropsHeldPrefix(t *testing.T) {
	v := testValues[0]
	out, err := io.ReadAll(Compile(v).Reader(&failing{data: []byte("ok " + v[:len(v)-1])}))
	if err == nil || string(out) != "ok " {
		t.Fatalf("got %q, %v; want %q and the error", out, err, "ok ")
	}
	// At EOF the same bytes matched nothing and are released as they are.
	out, _ = io.ReadAll(Compile(v).Reader(strings.NewReader("ok " + v[:len(v)-1])))
	if string(out) != "ok "+v[:len(v)-1] {
		t.Fatalf("at EOF: %q", out)
	}
}

// endless yields left bytes: line repeated.
type endless struct {
	left int
	line []byte
	pos  int
}

func (e *endless) Read(p []byte) (int, error) {
	if e.left == 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && e.left > 0 {
		c := copy(p[n:min(len(p), n+e.left)], e.line[e.pos:])
		e.pos = (e.pos + c) % len(e.line)
		n += c
		e.left -= c
	}
	return n, nil
}

// TestReader64MiBBoundedMemory streams 64 MiB with a secret in every 4 KiB
// and checks every one is masked while allocating a small fraction of the
// body.
func TestReader64MiBBoundedMemory(t *testing.T) {
	v := testValues[0]
	line := append(textBody(4096-len(v), 3), v...)
	s := Compile(testValues...)
	const size = 64 << 20
	src := &endless{left: size, line: line}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := s.Reader(src)
	n, err := io.Copy(io.Discard, r)
	runtime.ReadMemStats(&after)
	if err != nil || n != size {
		t.Fatalf("copied %d, %v", n, err)
	}
	if want := size / len(line); r.Count() < want {
		t.Errorf("Count = %d, want >= %d", r.Count(), want)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("allocated %d bytes for a 64 MiB body", alloc)
	}
}

// stalled returns (0, nil) forever.
type stalled struct{}

func (stalled) Read([]byte) (int, error) { return 0, nil }

// TestReaderNoProgress: a source that returns nothing forever ends in
// io.ErrNoProgress instead of a spinning Read.
func TestReaderNoProgress(t *testing.T) {
	n, err := Compile(testValues[0]).Reader(stalled{}).Read(make([]byte, 8))
	if n != 0 || !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("%d, %v", n, err)
	}
	_, err = Compile(testValues[0]).WebSocket(stalled{}).Read(make([]byte, 8))
	if !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("websocket: %v", err)
	}
}
