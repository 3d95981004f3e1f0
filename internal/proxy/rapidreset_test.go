package proxy_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestRapidResetNeverForwarded: a client that opens HTTP/2 streams and cancels each
// at once (HEADERS then RST_STREAM, CVE-2023-44487's pattern) on an intercepted
// connection to an injecting entry. A cancelled request is never dialled or sent,
// and new streams beyond the connection's rate are refused undecided, so the
// upstream sees almost none of them, and none carries the credential for nothing.
func TestRapidResetNeverForwarded(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	tc := tls.Client(w.connect(t, "api.allowed.test:443"), &tls.Config{
		ServerName: "api.allowed.test", RootCAs: w.CAPool, NextProtos: []string{"h2"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	go io.Copy(io.Discard, tc) // egressd's frames: read, so its writes never block
	io.WriteString(tc, http2.ClientPreface)
	fr := http2.NewFramer(tc, nil)
	fr.WriteSettings()
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"},
		{":authority", "api.allowed.test"}, {":path", "/reset"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	const pairs = 20000
	start := time.Now()
	for i := uint32(0); i < pairs; i++ {
		id := 2*i + 1
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(),
			EndStream: true, EndHeaders: true}); err != nil {
			break // egressd (net/http's server) ended the connection: also fine
		}
		if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			break
		}
	}
	elapsed := time.Since(start)
	time.Sleep(500 * time.Millisecond) // let the handlers that started finish
	got := w.Upstream.requests.Load()
	t.Logf("%d HEADERS+RST_STREAM pairs in %v: the upstream saw %d requests", pairs, elapsed, got)
	if limit := int64(500 + 250*elapsed.Seconds()); got > limit {
		t.Errorf("the upstream saw %d requests of %d cancelled streams, over the stream rate's %d", got, pairs, limit)
	}
}

// TestStreamRateCapped: new streams on one HTTP/2 connection beyond the stream rate
// (250 a second, bursts of 500) are refused overloaded/stream_rate before anything
// is decided or forwarded. It shows only where the client outruns the rate: on a
// quiet machine 1,500 streams take well under a second.
func TestStreamRateCapped(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	const streams = 1500
	start := time.Now()
	codes := make(chan int, streams)
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "https://api.allowed.test/s", nil)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				codes <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 503 && resp.Header.Get("Egressd-Reason") != "overloaded" {
				t.Errorf("503 with Egressd-Reason %q", resp.Header.Get("Egressd-Reason"))
			}
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	forwarded := w.Upstream.requests.Load()
	t.Logf("%d streams in %v: %v; the upstream saw %d", streams, elapsed, count, forwarded)
	if limit := int64(500 + 250*elapsed.Seconds()); forwarded > limit {
		t.Errorf("the upstream saw %d of %d streams opened in %v, over the stream rate's %d", forwarded, streams, elapsed, limit)
	}
	if count[503] == 0 {
		return // the streams came slower than the rate (a loaded machine, -race)
	}
	l := w.waitLog(t, func(m map[string]any) bool { return m["detail"] == "stream_rate" })
	if l["reason"] != "overloaded" || l["decision"] != "error" {
		t.Errorf("log line %v, want overloaded/stream_rate", l)
	}
}
