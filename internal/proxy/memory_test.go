package proxy_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/membudget"
)

// smallBudget is limits.memory in these tests: hook bodies get half of it, large
// request heads at most an eighth (1 MiB), HTTP/2 windows what is left.
const smallBudget = 8 << 20

func withBudget(n int64) func(*config.Limits) {
	return func(l *config.Limits) { l.Memory = n }
}

// budgetHeld reads egressd_memory_budget_bytes{holder} from the world's metrics.
func (w *world) budgetHeld(holder string) float64 {
	w.t.Helper()
	mfs, err := w.Metrics.Registry.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "egressd_memory_budget_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == holder {
				return m.GetGauge().GetValue()
			}
		}
	}
	w.t.Fatalf("no egressd_memory_budget_bytes{holder=%q}", holder)
	return 0
}

// largeHead is a request head of about 60 KiB (within limits.max_header_bytes)
// without its end.
func largeHead(i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "GET http://allowed.test/held/%d HTTP/1.1\r\nHost: allowed.test\r\n", i)
	for j := range 60 {
		fmt.Fprintf(&b, "X-Fill-%02d: %s\r\n", j, strings.Repeat("a", 1000))
	}
	return b.String()
}

// TestLargeHeadsDrawOnTheBudget: connections that each send most of a large
// request head and stall hold it in memory the budget counts; once large heads
// hold their eighth of it, the next is refused 503 overloaded (detail
// memory_heads) while it still arrives. A request with an ordinary head is served
// meanwhile (it costs nothing beyond its connection's buffer), and the stalled
// heads' memory returns to the budget when their connections end.
func TestLargeHeadsDrawOnTheBudget(t *testing.T) {
	w := newWorld(t, worldOpts{limits: withBudget(smallBudget)})
	const conns = 24 // 24 x 60 KiB: more than the heads' 1 MiB
	type sent struct {
		c  net.Conn
		br *bufio.Reader
	}
	var all []sent
	for i := range conns {
		c, br := w.dialProxy(t)
		io.WriteString(c, largeHead(i))
		all = append(all, sent{c, br})
	}
	waitFor(t, func() bool { return w.budgetHeld("heads") > smallBudget/8-64<<10 }, "the heads to fill their share")
	if got := w.budgetHeld("heads"); got <= 0 || got > smallBudget/8 {
		t.Errorf("heads hold %.0f bytes of the budget, want some and at most %d", got, smallBudget/8)
	}
	var refused int
	var held []net.Conn
	time.Sleep(500 * time.Millisecond) // for the refusals of the heads that did not fit
	for i, s := range all {
		s.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := s.br.Peek(1); err != nil {
			held = append(held, s.c)
			continue
		}
		refused++
		resp, err := http.ReadResponse(s.br, nil)
		if err != nil {
			t.Fatalf("connection %d: reading the refusal: %v", i, err)
		}
		assertRefused(t, resp, http.StatusServiceUnavailable, "overloaded", "memory_heads")
	}
	if refused == 0 || len(held) == 0 {
		t.Fatalf("%d of %d stalled large heads refused, %d held: want some of each", refused, conns, len(held))
	}
	resp, err := w.client().Get("http://allowed.test/ordinary")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("ordinary request while large heads hold the budget: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, c := range held {
		c.Close()
	}
	waitFor(t, func() bool { return w.budgetHeld("heads") == 0 }, "the stalled heads' memory to return to the budget")
	t.Logf("%d stalled large heads held, %d refused", len(held), refused)
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestLargeHeadForwardedWhole: a head larger than the connection's buffer,
// followed on the same connection by its body and a pipelined request, is
// forwarded as sent, and the request after it is served on its own.
func TestLargeHeadForwardedWhole(t *testing.T) {
	w := newWorld(t, worldOpts{limits: withBudget(smallBudget)})
	big := strings.Repeat("b", 20000)
	c, br := w.dialProxy(t)
	io.WriteString(c, "POST http://allowed.test/first HTTP/1.1\r\nHost: allowed.test\r\nX-Big: "+big+
		"\r\nContent-Length: 5\r\n\r\nhelloGET http://allowed.test/second HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	for _, want := range []struct{ path, body, big string }{{"/first", "hello", big}, {"/second", "", ""}} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		e := decodeEcho(t, resp)
		if e.Path != want.path || e.Body != want.body || e.Header.Get("X-Big") != want.big {
			t.Errorf("upstream saw %s with body %q and an X-Big of %d bytes; want %s, %q, %d",
				e.Path, e.Body, len(e.Header.Get("X-Big")), want.path, want.body, len(want.big))
		}
	}
	if got := w.budgetHeld("heads"); got != 0 {
		t.Errorf("heads still hold %.0f bytes after being parsed", got)
	}
}

// TestUpstreamWindowsBounded: an intercepted HTTP/2 client that advertises a zero
// window and reads nothing asks on 16 streams for large answers. egressd can send
// the client none of it, so what the upstream manages to send is what egressd
// buffers: the upstream Transport's receive windows bound it to about a
// megabyte for the connection (Go's defaults would take 4 MiB a stream).
func TestUpstreamWindowsBounded(t *testing.T) {
	w := newInjectWorld(t, worldOpts{})
	var sent atomic.Int64
	w.Upstream.handler.Store(ptr(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 16<<10)
		rc := http.NewResponseController(rw)
		for range 1024 { // 16 MiB
			if _, err := rw.Write(chunk); err != nil || rc.Flush() != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
	})))
	fr := zeroWindowClient(t, w, "api.allowed.test")
	const streams = 16
	openStreams(t, fr, "GET", "api.allowed.test", streams)
	waitFor(t, func() bool { return w.Upstream.requests.Load() >= streams }, "every stream to reach the upstream")
	var last int64
	for settled := 0; settled < 5; time.Sleep(100 * time.Millisecond) { // until the upstream stops getting anywhere
		if n := sent.Load(); n == last {
			settled++
		} else {
			last, settled = n, 0
		}
	}
	if limit := int64(2 << 20); last > limit {
		t.Errorf("the upstream sent %d KiB to a client that reads nothing; egressd buffers at most %d KiB", last>>10, limit>>10)
	}
	t.Logf("%d streams: the upstream sent %d KiB before the windows closed", streams, last>>10)
}

// TestH2WindowsDrawOnTheBudget: an intercepted HTTP/2 stream with a body reserves
// its receive window from the budget, and so does each upstream HTTP/2 stream; a
// client that reads nothing and opens more streams than the budget can hold has
// the newest refused 503 overloaded, and the windows return to the budget when
// the connection ends. With smallBudget the windows have 4 MiB: 16 upstream
// streams, or 8 streams that also send a body. Which holder runs out first
// depends on how the streams interleave (each also reserves its request and its
// awaited response head, holder conns), so the refusal's detail is pinned below,
// with a budget left exactly too small for one more window.
func TestH2WindowsDrawOnTheBudget(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		streams      int
	}{
		{"upstream windows", "GET", 24}, // 24 x 256 KiB upstream
		{"client windows", "POST", 12},  // 12 x (256 KiB client + 256 KiB upstream)
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newInjectWorld(t, worldOpts{limits: withBudget(smallBudget)})
			w.Upstream.handler.Store(ptr(holdingHandler))
			fr := zeroWindowClient(t, w, "api.allowed.test")
			openStreams(t, fr, tc.method, "api.allowed.test", tc.streams)
			waitFor(t, func() bool { return fr.status("503") > 0 }, "a stream refused for the budget")
			if got := w.budgetHeld("h2_windows"); got <= 0 || got > smallBudget/2 {
				t.Errorf("HTTP/2 windows hold %.0f bytes of the budget, want some and at most %d", got, smallBudget/2)
			}
			waitFor(t, func() bool { return strings.Contains(w.logs.String(), `"reason":"overloaded","detail":"memory_`) },
				"the refusal's record")
			fr.Close()
			waitFor(t, func() bool { return w.budgetHeld("h2_windows") == 0 }, "the windows to return to the budget")
			t.Logf("%d %s streams: %d refused for the budget", tc.streams, tc.method, fr.status("503"))
		})
	}
}

// TestH2WindowRefusalDetail: a stream that finds room for its request and its
// awaited response head but not for its upstream window is refused 503
// overloaded with detail memory_h2_windows, and reaches no upstream.
func TestH2WindowRefusalDetail(t *testing.T) {
	w := newInjectWorld(t, worldOpts{limits: withBudget(smallBudget)})
	w.Upstream.handler.Store(ptr(holdingHandler))
	fr := zeroWindowClient(t, w, "api.allowed.test")
	request := membudget.RequestCost + 2*int64(config.DefaultMaxHeaderBytes)
	restore := w.Server.SpendBudget(request + upstreamWindow/2)
	defer restore()
	openStreams(t, fr, "GET", "api.allowed.test", 1)
	waitFor(t, func() bool { return fr.status("503") > 0 }, "the stream refused for the budget")
	waitFor(t, func() bool { return strings.Contains(w.logs.String(), `"detail":"memory_h2_windows"`) },
		"the refusal's record, detail memory_h2_windows")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("the upstream saw %d requests, want none", n)
	}
}

// upstreamWindow is the receive window egressd's upstream HTTP/2 client holds
// for each stream (server.go).
const upstreamWindow = 256 << 10

// holdingHandler answers a head, then a body the windows hold while the client
// reads nothing, and waits for a request body that never comes.
var holdingHandler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
	rw.WriteHeader(http.StatusOK)
	http.NewResponseController(rw).Flush()
	rw.Write(make([]byte, 1<<20))
	io.Copy(io.Discard, r.Body)
})

func ptr[T any](v T) *T { return &v }

// zeroWindowClient opens an intercepted HTTP/2 connection to host that advertises
// a zero initial window and never opens one; its reader answers settings and pings.
func zeroWindowClient(t *testing.T, w *world, host string) *lockedFramer {
	t.Helper()
	tc := tls.Client(w.connect(t, host+":443"), &tls.Config{ServerName: host, RootCAs: w.CAPool, NextProtos: []string{"h2"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(tc, http2.ClientPreface)
	fr := &lockedFramer{Framer: http2.NewFramer(tc, tc), Closer: tc, mu: make(chan struct{}, 1)}
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.write(func(f *http2.Framer) error {
		return f.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	})
	go fr.readNoWindow()
	return fr
}

// lockedFramer serialises one connection's frame writes, and counts the statuses
// of the answers it reads.
type lockedFramer struct {
	*http2.Framer
	io.Closer
	mu       chan struct{}
	statuses sync.Map // status -> *atomic.Int64
}

func (f *lockedFramer) status(code string) int64 {
	if n, ok := f.statuses.Load(code); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func (f *lockedFramer) write(fn func(*http2.Framer) error) error {
	f.mu <- struct{}{}
	defer func() { <-f.mu }()
	return fn(f.Framer)
}

func (f *lockedFramer) readNoWindow() {
	for {
		fr, err := f.ReadFrame()
		if err != nil {
			return
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				f.write(func(f *http2.Framer) error { return f.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !fr.IsAck() {
				f.write(func(f *http2.Framer) error { return f.WritePing(true, fr.Data) })
			}
		case *http2.MetaHeadersFrame:
			n, _ := f.statuses.LoadOrStore(fr.PseudoValue("status"), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}
	}
}

// openStreams opens n streams to host: GETs, or POSTs whose body never comes.
func openStreams(t *testing.T, fr *lockedFramer, method, host string, n int) {
	t.Helper()
	var hdr strings.Builder
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", method}, {":scheme", "https"}, {":authority", host}, {":path", "/big"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := range uint32(n) {
		err := fr.write(func(f *http2.Framer) error {
			return f.WriteHeaders(http2.HeadersFrameParam{StreamID: 2*i + 1, BlockFragment: []byte(hdr.String()),
				EndStream: method == "GET", EndHeaders: true})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestScrubDecodersDrawOnTheBudget: an upstream asked for identity that answers
// compressed anyway chooses the decoder's window (brotli's up to 16 MiB, held
// twice over as it grows); decoding draws that on the memory budget, read from
// the stream's own header, so a small window passes and one the budget cannot
// hold is refused 503 overloaded (detail memory_scrub) before any of it is
// decoded, and every reservation returns when its response ends.
func TestScrubDecodersDrawOnTheBudget(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: scrubEntries, limits: withBudget(smallBudget),
		credentials: map[string]string{"api": `{"token": "` + secretToken + `"}`, "forms": `{"token": "f"}`}})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		lgwin, _ := strconv.Atoi(r.URL.Query().Get("lgwin"))
		var b bytes.Buffer
		bw := brotli.NewWriterOptions(&b, brotli.WriterOptions{Quality: 5, LGWin: lgwin})
		io.WriteString(bw, "[["+r.Header.Get("Authorization")+"]]")
		bw.Close()
		rw.Header().Set("Content-Encoding", "br")
		rw.Write(b.Bytes())
	})
	got := w.fetch(t, "h1", "api.allowed.test", "/?lgwin=16", nil)
	if want := "[[" + stars(len("Bearer "+secretToken)) + "]]"; string(got.body) != want {
		t.Fatalf("a 64 KiB window: body %q, want %q", got.body, want)
	}
	got = w.fetch(t, "h1", "api.allowed.test", "/?lgwin=24", nil)
	if r := got.resp; r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Egressd-Reason") != "overloaded" ||
		!strings.Contains(string(got.body), `"detail":"memory_scrub"`) {
		t.Fatalf("a 16 MiB window past the budget: %d %q %s, want 503 overloaded memory_scrub",
			r.StatusCode, r.Header.Get("Egressd-Reason"), got.body)
	}
	waitFor(t, func() bool { return w.budgetHeld("scrub") == 0 }, "the decoders' reservations to return to the budget")
}

// TestResponseHeadsBounded: an upstream's response head is bounded like a
// client's request head (limits.max_header_bytes), on the pool's path and the
// Transports' alike, where net/http's default would let every awaited response
// hold 10 MiB outside the memory budget; each awaited head draws on the budget
// and gives it back when its response ends.
func TestResponseHeadsBounded(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: scrubEntries,
		credentials: map[string]string{"api": `{"token": "` + secretToken + `"}`, "forms": `{"token": "f"}`}})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		kb, _ := strconv.Atoi(r.URL.Query().Get("kb"))
		rw.Header().Set("X-Big", strings.Repeat("b", kb<<10))
		fields, _ := strconv.Atoi(r.URL.Query().Get("fields"))
		for i := range fields {
			rw.Header().Set(fmt.Sprintf("Z%x", i), "")
		}
		io.WriteString(rw, "ok")
	})
	for _, proto := range protos {
		if got := w.fetch(t, proto, "api.allowed.test", "/?kb=8", nil); got.resp.StatusCode != http.StatusOK {
			t.Errorf("%s: an 8 KiB head: %d, want 200", proto, got.resp.StatusCode)
		}
		got := w.fetch(t, proto, "api.allowed.test", "/?fields=1000", nil)
		if r := got.resp; r.StatusCode != http.StatusBadGateway || !strings.Contains(string(got.body), "response_header_count") {
			t.Errorf("%s: a head of 1000 fields: %d %s, want 502 response_header_count", proto, r.StatusCode, got.body)
		}
		got = w.fetch(t, proto, "api.allowed.test", "/?kb=100", nil)
		if r := got.resp; r.StatusCode != http.StatusBadGateway || r.Header.Get("Egressd-Reason") != "upstream_unreachable" {
			t.Errorf("%s: a 100 KiB head past max_header_bytes: %d %q, want 502 upstream_unreachable",
				proto, r.StatusCode, r.Header.Get("Egressd-Reason"))
		}
	}
	cc := w.h2ClientConn(t, "api.allowed.test:443")
	get := func() {
		req, _ := http.NewRequest("GET", "https://api.allowed.test/?kb=8", nil)
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get()
	time.Sleep(100 * time.Millisecond)
	base := w.budgetHeld("conns")
	for range 10 {
		get()
	}
	waitFor(t, func() bool { return w.budgetHeld("conns") <= base }, "every response head's reservation to return to the budget")
}
