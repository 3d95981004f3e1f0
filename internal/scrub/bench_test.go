package scrub

import (
	"bytes"
	"encoding/base64"
	"io"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time this process has used (all threads, user and
// system). The machine is shared, so wall-clock MB/s understates what one
// core does: the benchmarks also report throughput per CPU second.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loop runs body b.N times and reports "MB/cpu-s" (bytes per CPU second:
// per-core throughput whatever the machine's load) and "cpu-ns/op".
func loop(b *testing.B, bytesPerOp int, body func()) {
	b.SetBytes(int64(bytesPerOp))
	b.ReportAllocs()
	start := cpuTime(b)
	n := 0
	for b.Loop() {
		body()
		n++
	}
	cpu := cpuTime(b) - start
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/op")
	if bytesPerOp > 0 {
		b.ReportMetric(float64(bytesPerOp)*float64(n)/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}

// benchValues are three realistic credentials: a bearer token, a Basic
// credential and an API key.
var benchValues = []string{
	"Bearer " + "ghp_0123456789abcdefghijABCDEFGHIJ012345",
	"Basic " + base64.StdEncoding.EncodeToString([]byte("svc-deploy:Zq8!vT2#mWx9@pLr4")),
	"AKIA-7f3b9c1e5d2a4f6b8c0e1d3f5a7b9c2e",
}

// benchBody is n bytes of text with one echoed credential per 64 KiB (and
// one in a 1 KiB body).
func benchBody(n int) []byte {
	b := textBody(n, 11)
	for at := n / 2; at < n; at += 64 << 10 {
		copy(b[at:], benchValues[0])
	}
	return b
}

// BenchmarkReader: the streaming path c2 runs on every body of an injected
// request. 1KiB gives ns per 1 KiB body (ns/op); 1MiB gives MB/s per core.
func BenchmarkReader(b *testing.B) {
	s := Compile(benchValues...)
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"1MiB", 1 << 20}} {
		body := benchBody(size.n)
		b.Run(size.name, func(b *testing.B) {
			buf := make([]byte, 32<<10)
			loop(b, len(body), func() {
				r := s.Reader(bytes.NewReader(body))
				if _, err := io.CopyBuffer(io.Discard, r, buf); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkMatcher compares the candidate matchers on a 1 MiB body with the
// same patterns: bytes.Index once per pattern (refMask), the prefiltered
// Aho-Corasick DFA (Set.Bytes), and the DFA on every byte. The figures are in
// the package doc.
func BenchmarkMatcher(b *testing.B) {
	s := Compile(benchValues...)
	body := benchBody(1 << 20)
	b.Logf("%d patterns, longest %d bytes", s.Patterns(), s.MaxLen())
	b.Run("stdlib", func(b *testing.B) {
		loop(b, len(body), func() { refMask(s, body) })
	})
	m := *s.parts[0]
	m.pre = nil
	dfaOnly := *s
	dfaOnly.parts = []*matcher{&m}
	for _, m := range []struct {
		name string
		set  *Set
	}{{"ahocorasick", s}, {"dfa-only", &dfaOnly}} {
		b.Run(m.name, func(b *testing.B) {
			work := bytes.Clone(body)
			loop(b, len(body), func() {
				copy(work, body)
				m.set.Bytes(work)
			})
		})
	}
}

// BenchmarkCompile: building a Set for three credentials (why c2 caches
// Sets instead of compiling per request).
func BenchmarkCompile(b *testing.B) {
	loop(b, 0, func() { Compile(benchValues...) })
}

// BenchmarkDecodeReader: a 1 MiB body decoded and scrubbed, per coding
// (MB/s of decoded bytes), for the proxy's compressed responses.
func BenchmarkDecodeReader(b *testing.B) {
	s := Compile(benchValues...)
	body := benchBody(1 << 20)
	buf := make([]byte, 32<<10)
	for _, coding := range []string{"gzip", "br", "zstd"} {
		wire := encode(b, body, coding)
		b.Run(coding, func(b *testing.B) {
			loop(b, len(body), func() {
				dec, err := s.DecodeReader(bytes.NewReader(wire), coding)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, s.Reader(dec), buf); err != nil {
					b.Fatal(err)
				}
				_ = dec.Close()
			})
		})
	}
}

// BenchmarkWebSocket: a 1 MiB message in 16 KiB frames, server to client.
func BenchmarkWebSocket(b *testing.B) {
	s := Compile(benchValues...)
	body := benchBody(1 << 20)
	var frames []wsFrame
	for at := 0; at < len(body); at += 16 << 10 {
		op := byte(0)
		if at == 0 {
			op = 2
		}
		frames = append(frames, wsFrame{fin: at+16<<10 >= len(body), op: op, payload: body[at:min(len(body), at+16<<10)]})
	}
	wire := wsStream(frames...)
	buf := make([]byte, 32<<10)
	loop(b, len(body), func() {
		if _, err := io.CopyBuffer(io.Discard, s.WebSocket(bytes.NewReader(wire)), buf); err != nil {
			b.Fatal(err)
		}
	})
}
