package conformance_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// The limits of the limits world: small, so that the cases run in seconds.
const (
	readHeader = time.Second     // limits.read_header
	clientIdle = 2 * time.Second // limits.client_idle
	streamIdle = 2 * time.Second // limits.stream_idle
	// closeSlack is how much later than its limit a connection may be closed.
	closeSlack = 2 * time.Second
)

// limitsWorld is a world with the limits above; set changes them or adds others.
func limitsWorld(t *testing.T, set ...func(*egressdtest.Limits)) *world {
	l := &egressdtest.Limits{ReadHeader: readHeader.String(), ClientIdle: clientIdle.String(), ResponseHeader: "2s",
		StreamIdle: streamIdle.String()}
	for _, f := range set {
		f(l)
	}
	return newWorld(t, config{limits: l})
}

// TestOversizedAndSlowInput: a head beyond limits.max_header_bytes gets 431, a
// client that sends its head too slowly (slowloris) is cut off at
// limits.read_header while other clients are served, and a request whose body
// never arrives does not hold its connection forever.
func TestOversizedAndSlowInput(t *testing.T) {
	w := limitsWorld(t)
	big := strings.Repeat("a", 100<<10)
	oversized := []struct{ name, head string }{
		{"100 KiB header", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-Big: " + big + "\r\n\r\n"},
		{"100 KiB of small headers", "GET {T} HTTP/1.1\r\nHost: {H}\r\n" + strings.Repeat("X-A: "+strings.Repeat("b", 90)+"\r\n", 1100) + "\r\n"},
		{"100 KiB request line", "GET {T}?" + big + " HTTP/1.1\r\nHost: {H}\r\n\r\n"},
		{"100 KiB header without an end", "GET {T} HTTP/1.1\r\nHost: {H}\r\nX-Big: " + big},
	}
	for _, where := range []string{"explicit", "intercepted"} {
		for _, tc := range oversized {
			t.Run(tc.name+", "+where, func(t *testing.T) {
				k := w.begin(t)
				c, raw := k.smuggleConn(where, tc.head)
				go func() { c.Write([]byte(raw)) }() // egressd may stop reading before the end
				k.refused(k.response(c, http.MethodGet), http.StatusRequestHeaderFieldsTooLarge, "bad_request", "header_too_large")
				k.assertClosed(c, 3*time.Second)
				k.assertUpstreamSaw(0)
			})
		}
	}

	t.Run("slowloris: one byte per 100 ms", func(t *testing.T) {
		k := w.begin(t)
		start := time.Now()
		slow := k.slowloris(1)
		served := k.serveMeanwhile(readHeader)
		for i, c := range slow {
			if d := k.assertClosed(c, readHeader+closeSlack-time.Since(start)); t.Failed() {
				t.Fatalf("slow connection %d: closed after %v", i, d)
			}
		}
		if elapsed := time.Since(start); elapsed < readHeader/2 {
			t.Errorf("slow connection closed after %v, before limits.read_header (%v)", elapsed, readHeader)
		}
		t.Logf("other clients served while the slow one was open: %d", served)
		k.assertUpstreamSaw(served)
	})
	t.Run("slowloris: many slow clients at once", func(t *testing.T) {
		k := w.begin(t)
		start := time.Now()
		slow := k.slowloris(32)
		served := k.serveMeanwhile(readHeader)
		for _, c := range slow {
			k.assertClosed(c, readHeader+closeSlack-time.Since(start))
		}
		k.assertUpstreamSaw(served)
	})
	t.Run("slowloris inside an intercepted tunnel", func(t *testing.T) {
		k := w.begin(t)
		c := k.intercepted("api.allowed.test")
		start := time.Now()
		go trickle(c, "GET /slow HTTP/1.1\r\nHost: api.allowed.test\r\nX-Slow: ", 100*time.Millisecond)
		k.assertClosed(c, readHeader+closeSlack)
		if d := time.Since(start); d < readHeader/2 {
			t.Errorf("closed after %v, before limits.read_header", d)
		}
		k.assertUpstreamSaw(0)
	})
	t.Run("CONNECT, then no ClientHello", func(t *testing.T) {
		k := w.begin(t)
		c := k.connect("allowed.test:443")
		k.assertClosed(c, readHeader+closeSlack)
		k.assertUpstreamSaw(0)
	})
	t.Run("CONNECT, then a ClientHello one byte per 100 ms", func(t *testing.T) {
		k := w.begin(t)
		c := k.connect("allowed.test:443")
		go trickle(c, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"+strings.Repeat("\x00", 64), 100*time.Millisecond)
		k.assertClosed(c, readHeader+closeSlack)
		k.assertUpstreamSaw(0)
	})
	t.Run("idle keep-alive connection is closed", func(t *testing.T) {
		k := w.begin(t)
		c := k.dial()
		k.send(c, "GET http://allowed.test/idle HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		k.echo(k.response(c, http.MethodGet))
		start := time.Now()
		k.assertClosed(c, clientIdle+closeSlack)
		if d := time.Since(start); d < clientIdle/2 {
			t.Errorf("idle connection closed after %v, before limits.client_idle", d)
		}
	})
	stalled := []struct{ name, where, raw string }{
		{"upload whose announced body never comes", "explicit", "POST http://allowed.test/upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1000000\r\n\r\n"},
		{"upload that stalls midway", "explicit", "POST http://allowed.test/upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1000000\r\n\r\n" + strings.Repeat("x", 4096)},
		{"chunked upload that never ends", "explicit", "POST http://allowed.test/upload HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"},
		{"upload that stalls midway, intercepted", "intercepted", "POST /upload HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 1000000\r\n\r\n" + strings.Repeat("x", 4096)},
	}
	t.Run("stalled uploads", func(t *testing.T) {
		for _, tc := range stalled {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				k := w.begin(t)
				c, _ := k.smuggleConn(tc.where, "")
				k.send(c, tc.raw)
				// A forwarded body may be quiet for limits.stream_idle (a gRPC stream
				// between messages); past it the upload ends.
				bound := streamIdle + 2*time.Second + closeSlack
				start := time.Now()
				resp, err := readResponseWithin(c, bound)
				switch {
				case err == nil:
					k.body(resp)
					if resp.StatusCode < 400 {
						t.Errorf("a stalled upload got %d", resp.StatusCode)
					}
				case isTimeout(err):
					t.Errorf("a request whose body stalls holds its connection (and an upstream connection) "+
						"with no bound: still open after %v", bound)
				default:
					t.Logf("closed after %v: %v", time.Since(start), err)
				}
			})
		}
	})
}

// slowloris opens n connections that each send a request head one byte per 100 ms
// (for at most 10 s, or until egressd closes them).
func (k *kase) slowloris(n int) []*conn {
	var conns []*conn
	for range n {
		c := k.dial()
		go trickle(c, "GET http://allowed.test/slow HTTP/1.1\r\nHost: allowed.test\r\nX-Slow: "+strings.Repeat("s", 200), 100*time.Millisecond)
		conns = append(conns, c)
	}
	return conns
}

// trickle writes s one byte every d, stopping at the first write error or after
// 100 bytes.
func trickle(c *conn, s string, d time.Duration) {
	for i := 0; i < len(s) && i < 100; i++ {
		if _, err := c.Write([]byte{s[i]}); err != nil {
			return
		}
		time.Sleep(d)
	}
}

// serveMeanwhile sends ordinary requests on fresh connections for d and fails the
// case on any that is not served; it returns how many were.
func (k *kase) serveMeanwhile(d time.Duration) int {
	k.t.Helper()
	served := 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		start := time.Now()
		c := k.client()
		resp, err := c.Get(fmt.Sprintf("http://allowed.test/meanwhile/%d", served))
		if err != nil {
			k.t.Fatalf("a normal client was not served while slow clients were open: %v", err)
		}
		k.echo(resp)
		c.CloseIdleConnections()
		if took := time.Since(start); took > time.Second {
			k.t.Errorf("a normal request took %v while slow clients were open", took)
		}
		served++
	}
	return served
}

func readResponseWithin(c *conn, d time.Duration) (*http.Response, error) {
	c.SetReadDeadline(time.Now().Add(d))
	return http.ReadResponse(c.br, &http.Request{Method: http.MethodPost})
}

// TestMaxConnections: beyond limits.max_connections, when every connection is
// serving (here: a spliced TLS tunnel), each new connection is answered 503
// overloaded at once, not left hanging; once connections close, new ones are
// served again.
func TestMaxConnections(t *testing.T) {
	const max = 4
	w := limitsWorld(t, func(l *egressdtest.Limits) { l.MaxConnections = max })
	k := w.begin(t)
	var held []io.Closer
	for range max {
		tc, err := k.tlsOver(k.connect("allowed.test:443"), "allowed.test")
		if err != nil {
			t.Fatalf("spliced tunnel: %v", err)
		}
		held = append(held, tc)
	}
	time.Sleep(100 * time.Millisecond) // let egressd accept them all
	var wg sync.WaitGroup
	results := make(chan string, 4*max)
	for i := range 4 * max {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			c := k.dial()
			k.send(c, "GET http://allowed.test/over HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				results <- fmt.Sprintf("connection %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Egressd-Reason") != "overloaded" {
				results <- fmt.Sprintf("connection %d: %d %q", i, resp.StatusCode, resp.Header.Get("Egressd-Reason"))
			}
			if took := time.Since(start); took > 2*time.Second {
				results <- fmt.Sprintf("connection %d: answered after %v", i, took)
			}
		}()
	}
	wg.Wait()
	close(results)
	for r := range results {
		t.Error(r)
	}
	k.refused(k.raw("GET http://allowed.test/over HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), 503, "overloaded", "")
	k.assertUpstreamSaw(0)
	for _, c := range held {
		c.Close()
	}
	for i := 0; ; i++ {
		resp, err := k.client().Get("http://allowed.test/after")
		if err == nil && resp.StatusCode == http.StatusOK {
			k.echo(resp)
			break
		}
		if err == nil {
			k.body(resp)
		}
		if i == 100 {
			t.Fatalf("not served again after the held connections closed: %v", err)
		}
		sleepTick()
	}
}

// TestSlowClientsYieldSlots: at limits.max_connections, connections that are
// still sending their request head (slowloris) or idle between requests give
// their slots to new clients, oldest first, once they have waited 1 s (a wait
// shorter than that is a real client's between two stages of its request); a
// slow client holds slots only while nobody else needs them.
func TestSlowClientsYieldSlots(t *testing.T) {
	const max = 4
	w := limitsWorld(t, func(l *egressdtest.Limits) { l.MaxConnections, l.ReadHeader, l.ClientIdle = max, "30s", "30s" })
	t.Run("slowloris at max_connections", func(t *testing.T) {
		k := w.begin(t)
		slow := k.slowloris(max)
		time.Sleep(1200 * time.Millisecond) // every slot is held by a slow head, waiting past evictAfter
		for i := range max {
			resp := k.raw("GET http://allowed.test/share HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("client %d at max_connections: %d %q, want 200 in a slow client's slot",
					i, resp.StatusCode, resp.Header.Get("Egressd-Reason"))
			}
			k.echo(resp)
		}
		defer func() {
			for _, c := range slow {
				c.Close()
			}
		}()
		closed := 0
		for _, c := range slow {
			if k.isClosedWithin(c, 2*time.Second) {
				closed++
			}
		}
		if closed == 0 {
			t.Errorf("no slow connection gave up its slot")
		}
		t.Logf("slow connections evicted: %d of %d", closed, max)
	})
	t.Run("idle keep-alive at max_connections", func(t *testing.T) {
		k := w.begin(t)
		var idle []*conn
		for range max {
			c := k.dial()
			k.send(c, "GET http://allowed.test/first HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
			k.echo(k.response(c, http.MethodGet))
			idle = append(idle, c)
		}
		time.Sleep(1200 * time.Millisecond) // idle past evictAfter
		resp := k.raw("GET http://allowed.test/newcomer HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("newcomer at max_connections with %d idle connections: %d %q, want 200", max, resp.StatusCode, resp.Header.Get("Egressd-Reason"))
		}
		k.echo(resp)
		if !k.isClosedWithin(idle[0], 2*time.Second) {
			t.Errorf("the longest-idle connection was not the one evicted")
		}
	})
}
