package scrub

import (
	"bytes"
	"errors"
	"io"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// A compressed container is a body that is compressed as its own media type
// (a .gz, .zst or .zip download), not by a Content-Encoding: the client wants
// the compressed bytes, so the proxy decodes it (DecodeReader, with the
// coding Container returns), masks it, and compresses it again
// (EncodeReader), or refuses it when no decoder here reads the format.

// ErrContainer: a body in a compressed container format no decoder here
// reads (zip, bzip2, xz, 7z, rar, ...). The caller must not deliver it
// unscrubbed.
var ErrContainer = errors.New("scrub: compressed container format that cannot be scrubbed")

// containers maps media types to the content coding their body is in: ""
// for the formats that cannot be decoded here (the caller refuses them).
var containers = map[string]string{
	"application/gzip":                  "gzip",
	"application/x-gzip":                "gzip",
	"application/x-gunzip":              "gzip",
	"application/gzip-compressed":       "gzip",
	"application/x-gzip-compressed":     "gzip",
	"application/x-compressed-tar":      "gzip", // freedesktop's .tar.gz
	"application/x-tgz":                 "gzip",
	"application/zlib":                  "deflate", // RFC 6713
	"application/zstd":                  "zstd",    // RFC 8878
	"application/x-zstd":                "zstd",
	"application/x-zstd-compressed-tar": "zstd",
	"application/x-brotli":              "br",
	"application/brotli":                "br",
	"application/zip":                   "",
	"application/x-zip":                 "",
	"application/x-zip-compressed":      "",
	"application/java-archive":          "",
	"application/x-bzip":                "",
	"application/x-bzip2":               "",
	"application/x-bzip-compressed-tar": "",
	"application/x-xz":                  "",
	"application/x-xz-compressed-tar":   "",
	"application/x-lzma":                "",
	"application/x-lzip":                "",
	"application/x-lz4":                 "",
	"application/x-lzop":                "",
	"application/x-compress":            "",
	"application/x-7z-compressed":       "",
	"application/vnd.rar":               "",
	"application/x-rar-compressed":      "",
}

// containerSuffixes are RFC 6839 structured-syntax suffixes of compressed
// types (application/tlsrpt+gzip, application/epub+zip).
var containerSuffixes = map[string]string{"+gzip": "gzip", "+zstd": "zstd", "+zip": ""}

// sniffed are the media types whose body Container looks into: a server
// that does not know what it serves (no type, octet-stream, a tar that may
// be compressed) labels .gz and .zst downloads so.
var sniffed = map[string]bool{
	"": true, "application/octet-stream": true, "binary/octet-stream": true,
	"application/x-tar": true, "application/x-gtar": true, "application/force-download": true,
	"application/x-download": true,
}

// SniffLen is how many leading body bytes Container needs to sniff: the
// longest magic number it knows.
const SniffLen = 4

// Magic numbers: gzip's ID1 ID2 CM=deflate (RFC 1952), zstd's frame magic
// (RFC 8878, little-endian 0xFD2FB528).
var (
	gzipMagic = []byte{0x1f, 0x8b, 0x08}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// Sniffs reports whether Container looks at the body of a response with
// this Content-Type (the caller then passes its first SniffLen bytes).
func Sniffs(contentType string) bool { return sniffed[mediaType(contentType)] }

// Container returns the content coding a body of this Content-Type is
// compressed in as a container ("gzip", "deflate", "zstd", "br"; "" for a
// body that is not a compressed container), or ErrContainer for a container
// no decoder here reads. For the types Sniffs names, head (the body's first
// bytes) decides: gzip or zstd magic makes it a container.
func Container(contentType string, head []byte) (string, error) {
	mt := mediaType(contentType)
	coding, ok := containers[mt]
	for suffix, c := range containerSuffixes {
		if !ok && strings.HasSuffix(mt, suffix) {
			coding, ok = c, true
		}
	}
	switch {
	case ok && coding == "":
		return "", ErrContainer
	case ok:
		return coding, nil
	case !sniffed[mt]:
		return "", nil
	case bytes.HasPrefix(head, gzipMagic):
		return "gzip", nil
	case bytes.HasPrefix(head, zstdMagic):
		return "zstd", nil
	}
	return "", nil
}

// mediaType is the lower-cased type/subtype of a Content-Type value. A value
// mime.ParseMediaType rejects still has one, so none is read as missing.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// EncodeReader returns r's bytes compressed in coding ("gzip", "deflate" as
// zlib, "zstd" or "br"), flushed after each read of r so a stream stays a
// stream. Close releases the encoder; it does not close r. Levels favour
// speed: the body goes to the client over a local leg.
func EncodeReader(r io.Reader, coding string) (io.ReadCloser, error) {
	e := &encoder{src: r, tmp: make([]byte, maxRead)}
	var err error
	switch coding {
	case "gzip", "x-gzip":
		e.w, err = gzip.NewWriterLevel(&e.buf, gzip.BestSpeed)
	case "deflate":
		e.w, err = zlib.NewWriterLevel(&e.buf, zlib.BestSpeed)
	case "zstd":
		e.w, err = zstd.NewWriter(&e.buf, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithWindowSize(1<<20), zstd.WithLowerEncoderMem(true))
	case "br":
		e.w = brotli.NewWriterLevel(&e.buf, 4)
	default:
		err = ErrUnsupportedEncoding
	}
	if err != nil {
		return nil, err
	}
	return e, nil
}

// flushWriter is a compressor: each of the libraries' writers.
type flushWriter interface {
	io.WriteCloser
	Flush() error
}

// encoder compresses src into buf, one read of src at a time.
type encoder struct {
	src    io.Reader
	w      flushWriter
	buf    bytes.Buffer
	tmp    []byte
	err    error // returned once buf is drained
	closed bool  // w is closed
}

func (e *encoder) Read(p []byte) (int, error) {
	for e.buf.Len() == 0 && e.err == nil {
		e.fill()
	}
	if e.buf.Len() > 0 {
		return e.buf.Read(p)
	}
	return 0, e.err
}

// fill reads src once and compresses what it got; at its end the stream is
// closed (the trailer written), on its error the error is kept.
func (e *encoder) fill() {
	n, err := e.src.Read(e.tmp)
	if n > 0 {
		if _, werr := e.w.Write(e.tmp[:n]); werr != nil {
			e.err = werr
			return
		}
		if ferr := e.w.Flush(); ferr != nil {
			e.err = ferr
			return
		}
	}
	switch {
	case errors.Is(err, io.EOF):
		e.closed = true
		e.err = e.w.Close()
		if e.err == nil {
			e.err = io.EOF
		}
	case err != nil:
		e.err = err
	}
}

// Close releases the compressor (the zstd encoder's buffers).
func (e *encoder) Close() error {
	if e.err == nil {
		e.err = io.ErrClosedPipe
	}
	if e.closed {
		return nil
	}
	e.closed = true
	return e.w.Close()
}
