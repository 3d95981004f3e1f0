package scrub

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// Errors of DecodeReader. Their messages never quote the header or the
// body: an upstream can reflect a secret into either.
var (
	// ErrUnsupportedEncoding: a coding other than gzip, x-gzip, deflate, br,
	// zstd and identity, or more than maxCodings of them. The caller must not
	// deliver such a body unscrubbed (refuse it, or ask the upstream for
	// Accept-Encoding it can decode).
	ErrUnsupportedEncoding = errors.New("scrub: unsupported content-encoding")
	// ErrCorrupt: the body does not start like its declared coding.
	ErrCorrupt = errors.New("scrub: body does not match its content-encoding")
)

// maxCodings bounds the codings stacked in one Content-Encoding: each layer
// multiplies a decompression bomb's ratio and adds a decoder's memory, and
// real servers use one.
const maxCodings = 4

// zstdMaxWindow caps a zstd frame's window, so a hostile frame cannot make
// the decoder allocate more (the library's default allows 512 MiB): 8 MiB is
// the most the zstd HTTP content coding lets an encoder use (RFC 9659).
const zstdMaxWindow = 8 << 20

// DecodeReader returns r decoded to identity bytes per contentEncoding
// (gzip, x-gzip, deflate — zlib-wrapped or raw, as servers send both — br,
// zstd, identity, and lists like "gzip, br", applied in order so decoded in
// reverse). Decoding is streaming: memory is each decoder's window (32 KiB
// for gzip and deflate, at most 16 MiB for br, zstdMaxWindow for zstd), not
// the body, so a decompression bomb costs CPU and bytes to the client like
// any large body and nothing more; there is no ratio limit. Close releases
// the decoders; it does not close r (the caller owns the body). The caller
// then masks the result with Reader and re-encodes it or delivers identity
// (dropping Content-Encoding and Content-Length). The Set is not used: any
// Set, nil too, decodes the same.
func (s *Set) DecodeReader(r io.Reader, contentEncoding string) (io.ReadCloser, error) {
	codings, err := parseCodings(contentEncoding)
	if err != nil {
		return nil, err
	}
	d := &decoded{Reader: r}
	for i := len(codings) - 1; i >= 0; i-- {
		next, err := newDecoder(d.Reader, codings[i])
		if err != nil {
			_ = d.Close()
			return nil, err
		}
		d.Reader = next
		d.closers = append(d.closers, next)
	}
	return d, nil
}

// parseCodings splits a Content-Encoding value into its codings, lower-case,
// without identity.
func parseCodings(v string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(v, ",") {
		c = strings.ToLower(strings.TrimSpace(c))
		switch c {
		case "", "identity":
			continue
		case "gzip", "x-gzip", "deflate", "br", "zstd":
			out = append(out, c)
		default:
			return nil, ErrUnsupportedEncoding
		}
	}
	if len(out) > maxCodings {
		return nil, ErrUnsupportedEncoding
	}
	return out, nil
}

// newDecoder returns the decoder of one coding over r.
func newDecoder(r io.Reader, coding string) (io.ReadCloser, error) {
	switch coding {
	case "gzip", "x-gzip":
		br := bufio.NewReader(r)
		if _, err := br.Peek(1); errors.Is(err, io.EOF) {
			return io.NopCloser(br), nil // an empty body decodes to an empty body
		}
		z, err := gzip.NewReader(br)
		return z, corrupt("gzip", err)
	case "deflate":
		return newDeflate(r)
	case "br":
		return io.NopCloser(brotli.NewReader(r)), nil
	default: // "zstd", the only other coding parseCodings returns
		return newZstd(r)
	}
}

// zstdPool recycles zstd decoders: a decoder keeps its window buffers
// (megabytes) across Reset, so reuse spares an allocation per response.
var zstdPool sync.Pool // of *zstd.Decoder

// newZstd returns a pooled or new zstd decoder reading r.
func newZstd(r io.Reader) (io.ReadCloser, error) {
	if d, ok := zstdPool.Get().(*zstd.Decoder); ok {
		if err := d.Reset(r); err == nil {
			return &zstdReader{d: d}, nil
		}
		d.Close()
	}
	d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(zstdMaxWindow))
	if err != nil {
		return nil, corrupt("zstd", err)
	}
	return &zstdReader{d: d}, nil
}

// zstdReader returns its decoder to the pool on Close.
type zstdReader struct{ d *zstd.Decoder }

func (z *zstdReader) Read(p []byte) (int, error) {
	if z.d == nil {
		return 0, io.ErrClosedPipe
	}
	return z.d.Read(p)
}

func (z *zstdReader) Close() error {
	if z.d != nil {
		if z.d.Reset(nil) == nil {
			zstdPool.Put(z.d)
		} else {
			z.d.Close()
		}
		z.d = nil
	}
	return nil
}

// newDeflate decodes HTTP "deflate": zlib (RFC 1950) as specified, or the
// raw deflate (RFC 1951) that some servers send instead, told apart by the
// zlib header check.
func newDeflate(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	h, err := br.Peek(2)
	if len(h) == 0 && errors.Is(err, io.EOF) {
		return io.NopCloser(br), nil // an empty body decodes to an empty body
	}
	if err != nil && len(h) < 2 {
		return nil, corrupt("deflate", io.ErrUnexpectedEOF)
	}
	if h[0]&0x0f == 8 && h[0]>>4 <= 7 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
		z, err := zlib.NewReader(br)
		return z, corrupt("deflate", err)
	}
	return flate.NewReader(br), nil
}

// corrupt wraps a decoder's construction error in ErrCorrupt, naming the
// coding only (decoder errors quote no input, but stay safe).
func corrupt(coding string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (%s)", ErrCorrupt, coding)
}

// decoded is the chain of decoders DecodeReader returns.
type decoded struct {
	io.Reader
	closers []io.Closer
}

// Close closes every decoder, innermost first.
func (d *decoded) Close() error {
	var errs []error
	for _, c := range d.closers {
		errs = append(errs, c.Close())
	}
	d.closers = nil
	return errors.Join(errs...)
}
