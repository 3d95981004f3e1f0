package scrub

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// encoders compress with the real libraries, one per coding name.
var encoders = map[string]func(io.Writer) io.WriteCloser{
	"gzip":     func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) },
	"deflate":  func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) },
	"rawflate": func(w io.Writer) io.WriteCloser { z, _ := flate.NewWriter(w, flate.BestSpeed); return z },
	"br":       func(w io.Writer) io.WriteCloser { return brotli.NewWriter(w) },
	"zstd":     func(w io.Writer) io.WriteCloser { z, _ := zstd.NewWriter(w); return z },
}

// encode applies the codings in order, as a server writing
// "Content-Encoding: a, b" would.
func encode(t testing.TB, body []byte, codings ...string) []byte {
	t.Helper()
	for _, c := range codings {
		var buf bytes.Buffer
		w := encoders[c](&buf)
		if _, err := w.Write(body); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		body = buf.Bytes()
	}
	return body
}

// TestDecodeThenScrub: a secret inside each compressed body is masked once
// decoded; the header names each coding as servers send it.
func TestDecodeThenScrub(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	body := []byte(strings.Repeat(`{"echo":"`+v+`"}`+"\n", 100))
	want, wantN := refMask(s, body)
	cases := []struct {
		header  string
		codings []string
	}{
		{"gzip", []string{"gzip"}},
		{"X-GZIP", []string{"gzip"}},
		{"deflate", []string{"deflate"}},
		{"deflate", []string{"rawflate"}},
		{"br", []string{"br"}},
		{"zstd", []string{"zstd"}},
		{"gzip, br", []string{"gzip", "br"}},
		{"zstd,gzip , identity", []string{"zstd", "gzip"}},
		{"identity", nil},
		{"", nil},
	}
	for _, c := range cases {
		t.Run(c.header+"/"+strings.Join(c.codings, "+"), func(t *testing.T) {
			dec, err := s.DecodeReader(bytes.NewReader(encode(t, body, c.codings...)), c.header)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			r := s.Reader(dec)
			got, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(got, want) || r.Count() != wantN {
				t.Fatalf("got %d bytes (%v), %d replacements; want the reference, %d", len(got), err, r.Count(), wantN)
			}
		})
	}
}

func TestDecodeRefusals(t *testing.T) {
	var s *Set
	v := testValues[0]
	for _, header := range []string{"compress", "gzip, " + v, "gzip,gzip,gzip,gzip,gzip", "aes128gcm"} {
		_, err := s.DecodeReader(strings.NewReader("x"), header)
		if !errors.Is(err, ErrUnsupportedEncoding) || strings.Contains(err.Error(), v) {
			t.Errorf("%q: %v", header, err)
		}
	}
	// gzip and zlib headers are checked up front (ErrCorrupt); raw deflate,
	// br and zstd fail on the first Read. Either way: an error, no secret.
	for _, header := range []string{"gzip", "deflate", "zstd", "br"} {
		dec, err := s.DecodeReader(strings.NewReader(v+v), header)
		if err == nil {
			_, err = io.ReadAll(dec)
		}
		if err == nil || strings.Contains(err.Error(), v) {
			t.Errorf("%q on plain text: %v", header, err)
		}
	}
	if _, err := s.DecodeReader(strings.NewReader(v), "gzip"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("gzip on plain text: %v, want ErrCorrupt", err)
	}
}

// TestDecodeEmptyBody: servers send an empty body with a content coding
// (a 200 with nothing to say); that is an empty body, not a corrupt one.
func TestDecodeEmptyBody(t *testing.T) {
	for _, header := range []string{"gzip", "deflate", "gzip, deflate"} {
		dec, err := (*Set)(nil).DecodeReader(strings.NewReader(""), header)
		if err != nil {
			t.Fatalf("%q: %v", header, err)
		}
		if b, err := io.ReadAll(dec); err != nil || len(b) != 0 {
			t.Errorf("%q: %q, %v", header, b, err)
		}
	}
}

var update = flag.Bool("update", false, "rewrite testdata/bomb-32MiB.zst")

// bombPath is a zstd frame of 32 MiB of zeros (7 KiB on the wire), made by
// the real encoder: go test -run TestDecodeBombBoundedMemory -update.
const bombPath = "testdata/bomb-32MiB.zst"

// TestDecodeBombBoundedMemory: a 32 MiB zstd bomb is decoded and scrubbed as
// a stream: allocations stay a fraction of the decoded size.
func TestDecodeBombBoundedMemory(t *testing.T) {
	const size = 32 << 20
	if *update {
		writeBomb(t, size)
	}
	wire, err := os.ReadFile(bombPath)
	if err != nil {
		t.Fatal(err)
	}
	s := Compile(testValues...)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	dec, err := s.DecodeReader(bytes.NewReader(wire), "zstd")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, s.Reader(dec))
	_ = dec.Close()
	runtime.ReadMemStats(&after)
	if err != nil || n != size {
		t.Fatalf("decoded %d, %v", n, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 12<<20 {
		t.Errorf("allocated %d bytes for a %d-byte bomb", alloc, len(wire))
	}
}

func writeBomb(t *testing.T, size int) {
	var wire bytes.Buffer
	w, _ := zstd.NewWriter(&wire, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zero := make([]byte, 1<<20)
	for i := 0; i < size/len(zero); i++ {
		_, _ = w.Write(zero)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bombPath, wire.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
