package scrub

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// allocated is what f allocates in all, garbage included: an upper bound of what
// it holds at its peak.
func allocated(f func()) int64 {
	var least int64 = math.MaxInt64
	for range 3 {
		least = min(least, allocatedOnce(f))
	}
	return least
}

// allocatedOnce is one measure of allocated: the process's allocations while f
// runs, which another goroutine's (a parallel test's, the runtime's) can only add
// to, so allocated keeps the least of three.
func allocatedOnce(f func()) int64 {
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return int64(b.TotalAlloc - a.TotalAlloc)
}

// readSome reads 4 MiB of r, far enough for every coder to reach its largest state.
func readSome(t *testing.T, r io.Reader) {
	t.Helper()
	if _, err := io.CopyN(io.Discard, r, 4<<20); err != nil {
		t.Fatal(err)
	}
}

// brotliBomb compresses data with window lgwin (quality 5: at 0 and 1 the encoder
// widens any window below 18).
func brotliBomb(lgwin int, data []byte) []byte {
	var b bytes.Buffer
	w := brotli.NewWriterOptions(&b, brotli.WriterOptions{Quality: 5, LGWin: lgwin})
	w.Write(data)
	w.Close()
	return b.Bytes()
}

func encoded(t *testing.T, data []byte, coding string) []byte {
	t.Helper()
	if coding == "zstd" {
		var b bytes.Buffer
		w, _ := zstd.NewWriter(&b, zstd.WithWindowSize(zstdMaxWindow))
		w.Write(data)
		w.Close()
		return b.Bytes()
	}
	e, err := EncodeReader(bytes.NewReader(data), coding)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(e)
	return out
}

// The reservations DecodeCost and EncodeCost make cover what the coders really
// allocate, for the largest windows a sender can choose.
func TestCodingCosts(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefghij0123456789"), 2<<20) // 40 MiB: past every window
	bodies := map[string][]byte{
		"br24": brotliBomb(24, data), "br22": brotliBomb(22, data), "br16": brotliBomb(16, data),
		"zstd": encoded(t, data, "zstd"), "gzip": encoded(t, data, "gzip"), "deflate": encoded(t, data, "deflate"),
	}
	set := Compile("a-secret-value")
	for name, body := range bodies {
		coding := name
		if len(coding) > 2 && coding[:2] == "br" {
			coding = "br"
		}
		got := allocated(func() {
			d, err := set.DecodeReader(bytes.NewReader(body), coding)
			if err != nil {
				t.Fatal(err)
			}
			readSome(t, d)
			d.Close()
		})
		if want := DecodeCost(coding, int(body[0])); got > want {
			t.Errorf("decoding %s allocated %d KiB, DecodeCost reserves %d KiB", name, got>>10, want>>10)
		}
	}
	noise := make([]byte, 8<<20) // incompressible: 4 MiB of output is 4 MiB of input
	rand.NewChaCha8([32]byte{}).Read(noise)
	for _, coding := range []string{"gzip", "deflate", "zstd", "br"} {
		got := allocated(func() {
			e, err := EncodeReader(bytes.NewReader(noise), coding)
			if err != nil {
				t.Fatal(err)
			}
			readSome(t, e)
			e.Close()
		})
		if want := EncodeCost(coding); got > want {
			t.Errorf("encoding %s allocated %d KiB, EncodeCost reserves %d KiB", coding, got>>10, want>>10)
		}
	}
}

func TestBrotliWindowBits(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1<<10)
	for _, lgwin := range []int{10, 12, 15, 16, 17, 18, 21, 22, 24} {
		if got := brotliWindowBits(brotliBomb(lgwin, data)[0]); got != lgwin {
			t.Errorf("lgwin %d: read %d", lgwin, got)
		}
	}
}
