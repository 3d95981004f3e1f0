package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// The pool (h1pool.go) against net/http's Transport, configured as egressd
// configures its HTTP/1.1 transport: each case sends the same requests, built as
// the proxy builds an outbound request (diffOutbound), through both to a raw upstream on loopback that
// records every byte it reads, and compares, path against path, the upstream's
// transcript (request lines, header order and case, which requests shared a
// connection) and what the caller got back (the refusal's reason code, or the
// status, header, body bytes, body error and trailers). Every case runs over
// http and over https.

// diffStep is the upstream's answer to one request head, in arrival order.
type diffStep struct {
	resp  string // written once the head is read
	next  string // written right after resp, in a write (a TLS record) of its own
	later string // written laterDelay after resp (bytes no request asked for yet)
	hold  int    // answer only once this many heads have arrived (concurrent requests)
	close bool   // close the connection after writing
	hang  bool   // write resp, then never answer again on this connection
}

const laterDelay = 30 * time.Millisecond

// diffReq is one request of a case.
type diffReq struct {
	head  string        // the client's request head; the target host is filled in
	pause time.Duration // wait before sending
	par   int           // send this many copies at once
}

type diffCase struct {
	name  string
	steps []diffStep
	reqs  []diffReq // default: one GET
	// wantHead, when set, is exactly what the upstream reads first, both ways:
	// nothing added (User-Agent, Accept-Encoding), hop-by-hop fields gone.
	wantHead string
	// differs, when set, says why the pool answers differently from the Transport
	// on purpose; poolWant is then the start of the pool's outcome.
	differs, poolWant string
}

const (
	getHead  = "GET http://HOST/a?b=c HTTP/1.1\r\nHost: HOST\r\n\r\n"
	headHead = "HEAD http://HOST/h HTTP/1.1\r\nHost: HOST\r\n\r\n"
	ok2      = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
)

func get(pause time.Duration) diffReq { return diffReq{head: getHead, pause: pause} }

// reuse is long enough for the Transport's reader to see what the upstream did
// to an idle connection (laterDelay, a close) before the next request.
const reuse = 150 * time.Millisecond

var diffCases = []diffCase{
	{name: "keep-alive reuse", steps: []diffStep{{resp: ok2}, {resp: ok2}, {resp: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"}, {resp: ok2}},
		reqs:     []diffReq{get(0), get(0), {head: headHead}, get(0)},
		wantHead: "GET /a?b=c HTTP/1.1\r\nHost: HOST\r\n\r\n"},
	{name: "request head as the proxy sends it", steps: []diffStep{{resp: ok2}},
		reqs: []diffReq{{head: "GET http://HOST/p%20q?x=1&x=2 HTTP/1.1\r\nhost: HOST\r\nx-lower: a\r\nX-UPPER: b\r\n" +
			"Accept: */*\r\nConnection: keep-alive\r\nProxy-Connection: keep-alive\r\nKeep-Alive: 5\r\n" +
			"Accept-Encoding: br\r\nUser-Agent: curl/8\r\nX-Multi: 1\r\nX-Multi: 2\r\n" +
			"Proxy-Authorization: Basic eDp5\r\n\r\n"}},
		wantHead: "GET /p%20q?x=1&x=2 HTTP/1.1\r\nHost: HOST\r\nUser-Agent: curl/8\r\nAccept: */*\r\nAccept-Encoding: br\r\n" +
			"X-Lower: a\r\nX-Multi: 1\r\nX-Multi: 2\r\nX-Upper: b\r\n\r\n"},
	{name: "client asks to close", steps: []diffStep{{resp: ok2}, {resp: ok2}},
		reqs: []diffReq{{head: "GET http://HOST/ HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n"}, get(0)}},
	{name: "HTTP/1.0 client", steps: []diffStep{{resp: ok2}},
		reqs: []diffReq{{head: "GET http://HOST/ HTTP/1.0\r\nHost: HOST\r\n\r\n"}}},
	{name: "HEAD with Content-Length", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"}, {resp: ok2}},
		reqs: []diffReq{{head: headHead}, get(0)}},
	{name: "malformed status code", steps: []diffStep{{resp: "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n"}}},
	{name: "malformed protocol", steps: []diffStep{{resp: "HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}}},
	{name: "not HTTP at all", steps: []diffStep{{resp: "SSH-2.0-OpenSSH_9.6\r\n", close: true}}},
	{name: "LF line endings", steps: []diffStep{{resp: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok"}}},
	{name: "duplicate equal Content-Length", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "conflicting Content-Length", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!"}}},
	{name: "Content-Length list", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok!"}}},
	{name: "negative Content-Length", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok"}}},
	{name: "Content-Length and chunked", steps: []diffStep{
		{resp: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "unknown transfer coding", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok", close: true}}},
	{name: "bad chunk size", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"}}},
	{name: "chunk longer than declared", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nok\r\n0\r\n\r\n"}}},
	{name: "chunked cut before the last chunk", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", close: true}}},
	{name: "trailers", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "1xx before the answer", steps: []diffStep{{resp: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok2}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "many 1xx before the answer", steps: []diffStep{{resp: strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 12) + ok2}}},
	{name: "101 to a request that asked no upgrade", steps: []diffStep{{resp: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n", close: true}},
		differs: "RFC 9110 §15.2.2: a server switches only to a protocol the request's Upgrade named, and the pool only " +
			"carries requests without one; the Transport hands the caller the raw connection, which egressd would tunnel " +
			"for a client that asked nothing of the kind. The pool refuses it and closes the connection.",
		poolWant: "refused upstream_unreachable"},
	{name: "status code below 100", steps: []diffStep{{resp: "HTTP/1.1 099 Odd\r\n\r\n" + ok2, close: true}},
		differs: "the Transport returns a status no client can be sent (egressd would write \"HTTP/1.1 99 \"); the pool " +
			"refuses it. It used to skip it as if it were a 1xx and forward the 200 after it.",
		poolWant: "refused upstream_unreachable"},
	{name: "status code 999", steps: []diffStep{{resp: "HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok"}}},
	{name: "204 with a body", steps: []diffStep{{resp: "HTTP/1.1 204 No Content\r\n\r\nstray"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "304 with a body", steps: []diffStep{{resp: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nstray"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "204 whose body comes later", steps: []diffStep{{resp: "HTTP/1.1 204 No Content\r\n\r\n", later: "stray"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "HEAD answered with a body, later", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", later: "hello"}, {resp: ok2}},
		reqs: []diffReq{{head: headHead}, get(reuse)}},
	{name: "HEAD answered with a body, in a write of its own", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", next: "hello"}, {resp: ok2}},
		reqs: []diffReq{{head: headHead}, get(reuse)}},
	{name: "408 on an idle connection", steps: []diffStep{{resp: ok2, later: "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n", close: true}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "Connection: close", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "HTTP/1.0 response", steps: []diffStep{{resp: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "no length, read to EOF", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\n\r\nuntil the end", close: true}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "closed mid-body", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close: true}, {resp: ok2}},
		reqs: []diffReq{get(0), get(0)}},
	{name: "closed mid-head", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\nContent-Le", close: true}}},
	{name: "closed before answering", steps: []diffStep{{close: true}}},
	{name: "no answer within response_header", steps: []diffStep{{hang: true}}},
	{name: "oversized header", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Big: "+strings.Repeat("b", 1<<16)+"\r\n", 161) + "Content-Length: 2\r\n\r\nok"}}},
	{name: "large header within the limit", steps: []diffStep{{resp: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Big: "+strings.Repeat("b", 1<<16)+"\r\n", 8) + "Content-Length: 2\r\n\r\nok"}}},
	{name: "stale idle connection", steps: []diffStep{{resp: ok2, close: true}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "stale idle connection, closed after the request", steps: []diffStep{{resp: ok2}, {close: true}, {resp: ok2}},
		reqs: []diffReq{get(0), get(reuse)}},
	{name: "two stale idle connections", steps: []diffStep{{resp: ok2, hold: 2, close: true}, {resp: ok2, hold: 2, close: true}, {resp: ok2}},
		reqs: []diffReq{{head: getHead, par: 2}, get(reuse)}},
	{name: "two idle connections that close unanswered", steps: []diffStep{{resp: ok2, hold: 2}, {resp: ok2, hold: 2}, {close: true}, {close: true}, {resp: ok2}},
		reqs: []diffReq{{head: getHead, par: 2}, get(reuse)}},
}

// TestUpstreamPoolMatchesTransport runs every case through both paths.
func TestUpstreamPoolMatchesTransport(t *testing.T) {
	for _, scheme := range []string{"http", "https"} {
		for _, tc := range diffCases {
			t.Run(scheme+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				pool := runDiff(t, scheme, tc, poolPath)
				tr := runDiff(t, scheme, tc, transportPath)
				checkDiff(t, tc, pool, tr)
			})
		}
	}
}

func checkDiff(t *testing.T, tc diffCase, pool, tr diffRun) {
	t.Helper()
	if tc.differs != "" {
		if !strings.HasPrefix(pool.outcomes[0], tc.poolWant) {
			t.Errorf("pool: got %q, want %q (%s)", pool.outcomes[0], tc.poolWant, tc.differs)
		}
		if pool.outcomes[0] == tr.outcomes[0] {
			t.Errorf("pool and Transport agree (%q): drop the documented difference", pool.outcomes[0])
		}
		return
	}
	if tc.wantHead != "" && (len(pool.conns) == 0 || !strings.HasPrefix(pool.conns[0], tc.wantHead)) {
		t.Errorf("the upstream read %q, want first %q", pool.conns, tc.wantHead)
	}
	if got, want := pool.transcript(), tr.transcript(); got != want {
		t.Errorf("the upstream read, from the pool:\n%s\nfrom the Transport:\n%s", got, want)
	}
	if !slices.Equal(pool.outcomes, tr.outcomes) {
		t.Errorf("the caller got, from the pool:\n%s\nfrom the Transport:\n%s",
			strings.Join(pool.outcomes, "\n--\n"), strings.Join(tr.outcomes, "\n--\n"))
	}
}

// diffPath sends out one way.
type diffPath func(c *Client, out *http.Request) (*http.Response, error)

func poolPath(c *Client, out *http.Request) (*http.Response, error) {
	return c.pool.roundTrip(out)
}

func transportPath(c *Client, out *http.Request) (*http.Response, error) {
	return c.viaTransport(c.h1, out, nil)
}

// diffRun is what one path produced: what the upstream read on each connection,
// and what each request's caller got.
type diffRun struct {
	conns    []string
	outcomes []string
}

// transcript renders the connections, sorted: concurrent requests may take
// either connection.
func (r diffRun) transcript() string {
	c := slices.Clone(r.conns)
	slices.Sort(c)
	return fmt.Sprintf("%d connections:\n%s", len(c), strings.Join(c, "\n== next connection ==\n"))
}

func runDiff(t testing.TB, scheme string, tc diffCase, send diffPath) diffRun {
	up := startDiffUpstream(t, scheme == "https", tc.steps)
	c := diffClient(t, up.ca)
	defer c.CloseIdle()
	var run diffRun
	for _, r := range tc.reqs {
		time.Sleep(r.pause)
		run.outcomes = append(run.outcomes, sendCopies(t, c, send, scheme, up.addr, r)...)
	}
	if len(tc.reqs) == 0 {
		run.outcomes = sendCopies(t, c, send, scheme, up.addr, get(0))
	}
	for _, c := range up.transcripts() {
		run.conns = append(run.conns, strings.ReplaceAll(c, up.addr, "HOST"))
	}
	return run
}

// sendCopies sends r.par copies of r at once (one when par is 0) and returns
// what each caller got, sorted.
func sendCopies(t testing.TB, c *Client, send diffPath, scheme, addr string, r diffReq) []string {
	n := max(r.par, 1)
	out := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := send(c, diffOutbound(t, r.head, scheme, addr))
			out[i] = diffOutcome(resp, err)
		})
	}
	wg.Wait()
	slices.Sort(out)
	return out
}

// diffOutbound builds the upstream request from the client's head as the proxy's
// outbound does for an allowed request: its own header map without hop-by-hop
// fields, the decided target in the URL and the context, an empty User-Agent so
// that none is added.
func diffOutbound(t testing.TB, head, scheme, addr string) *http.Request {
	head = strings.ReplaceAll(head, "HOST", addr)
	if scheme == "https" {
		head = strings.Replace(head, "http://", "https://", 1)
	}
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
	if err != nil {
		t.Fatalf("bad test request %q: %v", head, err)
	}
	ap := netip.MustParseAddrPort(addr)
	target := allowlist.Target{Host: ap.Addr().String(), Addr: ap.Addr(), Port: ap.Port()}
	out := req.WithContext(WithTarget(context.Background(), target))
	out.URL.Scheme, out.URL.Host, out.RequestURI, out.Close = scheme, target.String(), "", false
	out.Header = req.Header.Clone()
	for _, name := range allowlist.HopByHop {
		delete(out.Header, name)
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = nil
	}
	if req.ContentLength == 0 {
		out.Body = http.NoBody
	}
	return out
}

// diffOutcome renders what the caller got: the refusal's reason code, or the
// response as egressd reads it, body and trailers included.
func diffOutcome(resp *http.Response, err error) string {
	if err != nil {
		return "refused " + diffReason(err) + " "
	}
	defer resp.Body.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s length=%d te=%v close=%t\n", resp.Proto, resp.Status, resp.ContentLength, resp.TransferEncoding, resp.Close)
	writeSorted(&b, resp.Header)
	if _, ok := resp.Body.(io.ReadWriteCloser); ok {
		b.WriteString("the body is the connection\n") // a 101's, to be tunnelled
	}
	body, err := io.ReadAll(resp.Body)
	fmt.Fprintf(&b, "body %q error %v\n", body, err)
	writeSorted(&b, resp.Trailer)
	return b.String()
}

// diffReason is the reason code the proxy gives these failures (its classify):
// every one is upstream_unreachable but a timeout.
func diffReason(err error) string {
	if IsTimeout(err) {
		return "upstream_timeout"
	}
	return "upstream_unreachable"
}

func writeSorted(b *strings.Builder, h http.Header) {
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(b, "%s:", k)
		for _, v := range h[k] {
			if len(v) > 64 {
				v = fmt.Sprintf("%s... (%d bytes)", v[:16], len(v))
			}
			fmt.Fprintf(b, " %q", v)
		}
		b.WriteString("\n")
	}
}

// diffClient is a Client whose guard opens loopback only (nothing leaves the
// machine), trusting ca for https.
func diffClient(t testing.TB, ca *testpki.CA) *Client {
	guard, err := netguard.New(netguard.Options{UnsafeAllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	if err != nil {
		t.Fatal(err)
	}
	limits := config.Default().Limits
	limits.ResponseHeader = 8 * time.Second // reading the oversized head takes seconds under -race on a loaded machine
	return New(Options{Guard: guard, Limits: limits,
		Resolver: netguard.NewResolver("127.0.0.1:1", limits.DNS), // never asked: targets are literals
		TLS:      &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}})
}

// diffUpstream is a raw HTTP/1.1 upstream on loopback that answers request heads
// with its steps, in arrival order, and records every byte it reads.
type diffUpstream struct {
	addr string
	ca   *testpki.CA

	mu      sync.Mutex
	cond    *sync.Cond
	steps   []diffStep
	arrived int
	conns   []*strings.Builder
}

func startDiffUpstream(t testing.TB, useTLS bool, steps []diffStep) *diffUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &diffUpstream{addr: ln.Addr().String(), ca: testpki.New(t), steps: steps}
	u.cond = sync.NewCond(&u.mu)
	if useTLS {
		leaf := u.ca.Leaf(t, "127.0.0.1")
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{leaf}, NextProtos: []string{"http/1.1"}})
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { u.serve(c) })
		}
	})
	return u
}

func (u *diffUpstream) serve(c net.Conn) {
	defer c.Close()
	u.mu.Lock()
	rec := &strings.Builder{}
	u.conns = append(u.conns, rec)
	u.mu.Unlock()
	br := bufio.NewReader(c)
	for {
		head, err := readHead(br)
		u.mu.Lock()
		rec.WriteString(head)
		u.mu.Unlock()
		if err != nil {
			return
		}
		st := u.next()
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, st.resp)
		if st.next != "" {
			io.WriteString(c, st.next)
		}
		if st.later != "" {
			time.Sleep(laterDelay)
			io.WriteString(c, st.later)
		}
		if st.hang {
			io.Copy(io.Discard, br)
			return
		}
		if st.close {
			return
		}
	}
}

// next waits for the step's hold and takes it; past the last step it answers ok2.
func (u *diffUpstream) next() diffStep {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.arrived++
	u.cond.Broadcast()
	if len(u.steps) == 0 {
		return diffStep{resp: ok2}
	}
	st := u.steps[0]
	u.steps = u.steps[1:]
	deadline := time.AfterFunc(5*time.Second, func() { u.mu.Lock(); u.arrived = 1 << 30; u.cond.Broadcast(); u.mu.Unlock() })
	defer deadline.Stop()
	for u.arrived < st.hold {
		u.cond.Wait()
	}
	return st
}

// readHead reads one request head, raw, up to and including its blank line.
func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" || line == "\n" {
			return b.String(), nil
		}
	}
}

func (u *diffUpstream) transcripts() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, len(u.conns))
	for i, c := range u.conns {
		out[i] = c.String()
	}
	return out
}
