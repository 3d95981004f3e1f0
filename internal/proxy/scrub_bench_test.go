package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/egressd/egressd/internal/scrub"
)

// BenchmarkResponse1KiB is what egressd spends writing a 1 KiB HTTP/1.1 response
// to the client, without scrubbing (a request without injection), with scrubbing
// and nothing to mask (the intercept path), and with the credential reflected in
// a header (the credential path): the difference is scrubbing's cost per request,
// to set against the whole request's CPU (bench: tens of µs). The +env100 cases
// also mask the values of 100 environment_variable credentials, as every response
// is when that many are loaded.
func BenchmarkResponse1KiB(b *testing.B) {
	const value = "Bearer bench-fake-token-not-a-secret"
	body := bytes.Repeat([]byte("x"), 1024)
	set := scrub.Compile(value, "bench-transform-value")
	var env []string
	for i := range 100 {
		env = append(env, fmt.Sprintf("sk-env-%03d-%032x", i, i*7919))
	}
	withEnv := scrub.Join(scrub.Compile(env...), set)
	for _, bc := range []struct {
		name string
		set  *scrub.Set
		echo bool
	}{{"none", nil, false}, {"scrubbed", set, false}, {"scrubbed+echo", set, true},
		{"scrubbed+env100", withEnv, false}, {"scrubbed+env100+echo", withEnv, true}} {
		b.Run(bc.name, func(b *testing.B) {
			bw := bufio.NewWriterSize(io.Discard, 4096)
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				resp := &http.Response{StatusCode: 200, ContentLength: 1024, Header: http.Header{
					"Content-Type": {"application/octet-stream"}, "Date": {"Tue, 01 Dec 2026 18:00:00 GMT"},
				}, Body: io.NopCloser(bytes.NewReader(body))}
				if bc.echo {
					resp.Header["X-Bench-Echo"] = []string{value}
				}
				x := &exchange{snap: &Snapshot{}, scrub: bc.set, rec: &Record{}, req: &http.Request{Method: http.MethodGet}}
				if _, err := writeResponse(bw, http.MethodGet, false, x.scrubbed(resp), x.rec); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time rather than wall time: on a shared machine the wall clock
			// counts other processes' turns too.
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the process's user and system CPU time, in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
