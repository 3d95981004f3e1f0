package scrub

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestContainer: the media types name their container, whatever their case
// and parameters; undecodable formats are ErrContainer; only untyped and
// octet-stream bodies are sniffed, by gzip and zstd magic.
func TestContainer(t *testing.T) {
	gz, zst := encode(t, []byte("x"), "gzip"), encode(t, []byte("x"), "zstd")
	for _, c := range []struct {
		ctype string
		head  []byte
		want  string
		err   error
	}{
		{"application/gzip", nil, "gzip", nil},
		{"Application/X-GZIP; charset=binary", nil, "gzip", nil},
		{"application/tlsrpt+gzip", nil, "gzip", nil},
		{"application/zlib", nil, "deflate", nil},
		{"application/zstd", nil, "zstd", nil},
		{"application/x-brotli", nil, "br", nil},
		{"application/zip", nil, "", ErrContainer},
		{"application/epub+zip", nil, "", ErrContainer},
		{"application/x-bzip2", gz, "", ErrContainer},
		{"application/x-xz", nil, "", ErrContainer},
		{"application/x-7z-compressed", nil, "", ErrContainer},
		{"", gz, "gzip", nil},
		{"application/octet-stream", zst, "zstd", nil},
		{"application/x-tar", gz, "gzip", nil},
		{"application/octet-stream", []byte("PK\x03\x04"), "", nil},
		{"", gz[:2], "", nil},
		{"application/json", gz, "", nil},
		{"text/plain; charset=utf-8", zst, "", nil},
	} {
		got, err := Container(c.ctype, c.head)
		if got != c.want || !errors.Is(err, c.err) {
			t.Errorf("Container(%q, % x): %q, %v; want %q, %v", c.ctype, c.head, got, err, c.want, c.err)
		}
		if sniffs := Sniffs(c.ctype); sniffs != (c.ctype == "" || strings.Contains(c.ctype, "octet") || strings.Contains(c.ctype, "tar")) {
			t.Errorf("Sniffs(%q) = %v", c.ctype, sniffs)
		}
	}
}

// TestContainerRecoded: a compressed container holding a secret comes out
// in the same format, its content masked, for every format decoded.
func TestContainerRecoded(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	body := []byte(strings.Repeat(`{"stored":"`+v+`"}`+"\n", 500))
	want, wantN := refMask(s, body)
	for _, coding := range []string{"gzip", "deflate", "zstd", "br"} {
		t.Run(coding, func(t *testing.T) {
			dec, err := s.DecodeReader(bytes.NewReader(encode(t, body, coding)), coding)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Close()
			r := s.Reader(dec)
			enc, err := EncodeReader(r, coding)
			if err != nil {
				t.Fatal(err)
			}
			wire, err := io.ReadAll(enc)
			if err != nil || enc.Close() != nil {
				t.Fatal(err)
			}
			if r.Count() != wantN {
				t.Errorf("%d replacements, want %d", r.Count(), wantN)
			}
			plain, err := s.DecodeReader(bytes.NewReader(wire), coding)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(plain)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("decoded %d bytes (%v), want the %d masked ones", len(got), err, len(want))
			}
		})
	}
}

// TestEncodeReaderStreams: what one read of the source gave is compressed
// and flushed before the next read, so a stream reaches the client whole.
func TestEncodeReaderStreams(t *testing.T) {
	for _, coding := range []string{"gzip", "deflate", "zstd", "br"} {
		src := &chunks{parts: [][]byte{[]byte("first event\n\n"), []byte("second event\n\n")}}
		enc, err := EncodeReader(src, coding)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64<<10)
		n, err := enc.Read(buf)
		if err != nil || src.reads != 1 {
			t.Fatalf("%s: %d bytes after %d reads, %v", coding, n, src.reads, err)
		}
		dec, err := Compile().DecodeReader(bytes.NewReader(buf[:n]), coding)
		if err != nil {
			t.Fatalf("%s: %v", coding, err)
		}
		got := make([]byte, 13)
		if _, err := io.ReadFull(dec, got); err != nil || string(got) != "first event\n\n" {
			t.Errorf("%s: the first read decodes to %q, %v", coding, got, err)
		}
		enc.Close()
	}
}

// TestEncodeReaderUnknown: a coding without an encoder is an error.
func TestEncodeReaderUnknown(t *testing.T) {
	if _, err := EncodeReader(strings.NewReader("x"), "compress"); !errors.Is(err, ErrUnsupportedEncoding) {
		t.Errorf("got %v", err)
	}
}
