package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/proxy"
)

func contextWithTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestForwardAllowedReachesUpstreamWithCleanHeaders(t *testing.T) {
	w := newWorld(t, worldOpts{})
	req, _ := http.NewRequest("GET", "http://Allowed.TEST./hello?q=1", nil)
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	req.Header.Set("Egressd-Hook-Assertion", "forged")
	req.Header.Set("Connection", "X-Drop-Me")
	req.Header.Set("X-Drop-Me", "1")
	req.Header.Set("X-Keep", "kept")
	resp, err := w.client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := decodeEcho(t, resp)
	if got.Host != "allowed.test" || got.Path != "/hello" {
		t.Errorf("upstream saw host %q path %q", got.Host, got.Path)
	}
	for _, h := range []string{"Proxy-Authorization", "Egressd-Hook-Assertion", "X-Drop-Me"} {
		if v := got.Header.Get(h); v != "" {
			t.Errorf("upstream received %s: %q", h, v)
		}
	}
	if got.Header.Get("X-Keep") != "kept" {
		t.Errorf("X-Keep not forwarded: %v", got.Header)
	}
	line := w.lastLog("")
	want := map[string]any{"decision": "allow", "reason": "", "host": "allowed.test", "port": 80.0,
		"path": "/hello", "rule": "allowed.test", "status": 200.0, "resolved_ip": w.PublicIP, "scheme": "http"}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("log %s = %v, want %v", k, line[k], v)
		}
	}
	for _, k := range logFields {
		if _, ok := line[k]; !ok {
			t.Errorf("log line lacks %q", k)
		}
	}
	w.assertNoCanaryHit()
}

// logFields is docs/observability.md's list: every field on every line.
var logFields = []string{"req_id", "listener", "role", "client", "method", "scheme", "host", "port",
	"path", "decision", "reason", "rule", "intercepted", "injected", "credential", "credential_version",
	"hook_group", "hook_event", "status", "bytes_in", "bytes_out", "resolved_ip", "dur_ms"}

func TestConnectAllowedIsSplicedEndToEnd(t *testing.T) {
	w := newWorld(t, worldOpts{})
	client := w.client()
	resp, err := client.Get("https://allowed.test/tls")
	if err != nil {
		t.Fatal(err)
	}
	got := decodeEcho(t, resp)
	client.CloseIdleConnections() // the tunnel is logged when it closes
	if got.Path != "/tls" || got.Host != "allowed.test" {
		t.Errorf("upstream saw %+v", got)
	}
	line := w.lastLog("")
	if line["method"] != "CONNECT" || line["status"] != 200.0 || line["bytes_out"].(float64) == 0 {
		t.Errorf("tunnel log line: %v", line)
	}
	w.assertNoCanaryHit()
}

// TestRefusals drives each refusal end to end and checks status, reason, detail,
// that the upstream saw nothing, and that no canary was reached.
func TestRefusals(t *testing.T) {
	w := newWorld(t, worldOpts{allowlist: append([]allowlist.Entry{{Domain: "*"}}, defaultEntries...)})
	strict := newWorld(t, worldOpts{})
	cases := []struct {
		name, url  string
		w          *world
		status     int
		reason     string
		detail     string
		connectToo bool
	}{
		{"not allowlisted", "http://evil.test/", strict, 403, "not_allowlisted", "", true},
		{"apex of wildcard only by exact entry", "http://x.y.ports.test/", strict, 403, "not_allowlisted", "", true},
		{"port not allowed", "http://allowed.test:8080/", strict, 403, "port_not_allowed", "", true},
		{"entry ports replace defaults", "http://ports.test/", strict, 403, "port_not_allowed", "", true},
		{"name resolves to loopback", "http://loopback.allowed.test/", strict, 403, "internal_address", "loopback", true},
		{"name resolves to metadata", "http://metadata.allowed.test/", strict, 403, "internal_address", "metadata", true},
		{"name resolves to private", "http://private.allowed.test/", strict, 403, "internal_address", "private", true},
		{"name resolves to cgnat", "http://cgnat.allowed.test/", strict, 403, "internal_address", "cgnat", true},
		{"mixed public and private answers", "http://mixed.allowed.test/", strict, 403, "internal_address", "private", true},
		{"CNAME to a private address", "http://cname.allowed.test/", strict, 403, "internal_address", "private", true},
		{"AAAA v4-mapped loopback", "http://mapped.allowed.test/", strict, 403, "internal_address", "loopback", true},
		{"AAAA ULA", "http://ula.allowed.test/", strict, 403, "internal_address", "private", true},
		{"AAAA v6 metadata", "http://v6meta.allowed.test/", strict, 403, "internal_address", "metadata", true},
		{"NXDOMAIN", "http://nx.allowed.test/", strict, 502, "dns_failure", "", true},
		{"star: loopback literal", "http://127.0.0.1/", w, 403, "internal_address", "loopback", true},
		{"star: short loopback", "http://127.1/", w, 403, "internal_address", "loopback", false},
		{"star: decimal loopback", "http://2130706433/", w, 403, "internal_address", "loopback", false},
		{"star: hex loopback", "http://0x7f.0.0.1/", w, 403, "internal_address", "loopback", false},
		{"star: octal loopback", "http://0177.0.0.1/", w, 403, "internal_address", "loopback", false},
		{"star: v4-mapped v6 loopback", "http://[::ffff:127.0.0.1]/", w, 403, "internal_address", "loopback", true},
		{"star: v6 loopback", "http://[::1]/", w, 403, "internal_address", "loopback", true},
		{"star: metadata literal", "http://169.254.169.254/latest/meta-data/", w, 403, "internal_address", "metadata", true},
		{"star: metadata decimal", "http://2852039166/", w, 403, "internal_address", "metadata", false},
		{"star: NAT64 of metadata", "http://[64:ff9b::a9fe:a9fe]/", w, 403, "internal_address", "metadata", true},
		{"star: 6to4 of private", "http://[2002:a00:5::1]/", w, 403, "internal_address", "private", true},
		{"star: v6 metadata", "http://[fd00:ec2::254]/", w, 403, "internal_address", "metadata", true},
		{"star: private literal", "http://10.0.0.5/", w, 403, "internal_address", "private", true},
		{"star: unspecified", "http://0.0.0.0/", w, 403, "internal_address", "unspecified", true},
		{"star: percent-encoded loopback", "http://%31%32%37.0.0.1/", w, 400, "bad_request", "malformed_request", false},
		{"star: rule matched, name resolves to loopback", "http://loopback.allowed.test/", w, 403, "internal_address", "loopback", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.w.Upstream.requests.Load()
			resp := tc.w.raw("GET " + tc.url + " HTTP/1.1\r\nHost: ignored.test\r\n\r\n")
			assertRefused(t, resp, tc.status, tc.reason, tc.detail)
			if tc.connectToo {
				authority := connectAuthority(t, tc.url)
				resp := tc.w.raw("CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n")
				assertRefused(t, resp, tc.status, tc.reason, tc.detail)
			}
			if n := tc.w.Upstream.requests.Load() - before; n != 0 {
				t.Errorf("upstream saw %d request(s)", n)
			}
		})
	}
	w.assertNoCanaryHit()
	strict.assertNoCanaryHit()
}

func connectAuthority(t *testing.T, rawURL string) string {
	u := strings.TrimPrefix(rawURL, "http://")
	host, _, _ := strings.Cut(u, "/")
	if _, _, err := net.SplitHostPort(host); err != nil {
		return host + ":443"
	}
	return host
}

// TestSelfIsNeverReachable opens loopback with unsafe_allow_cidrs and allows the
// proxy's own port: egressd's own listener stays unreachable through it (a fixed
// port is safe here: the namespace is the test's own).
func TestSelfIsNeverReachable(t *testing.T) {
	w := newWorld(t, worldOpts{
		allowlist: []allowlist.Entry{{Domain: "*", Ports: []uint16{15001}}},
		unsafe:    []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		proxyAddr: "127.0.0.1:15001",
	})
	for _, target := range []string{"127.0.0.1:15001", "[::ffff:127.0.0.1]:15001", "0.0.0.0:15001", "2130706433:15001"} {
		resp := w.raw("GET http://" + target + "/ HTTP/1.1\r\nHost: x\r\n\r\n")
		rb := assertRefused(t, resp, 403, "internal_address", "")
		if target == "127.0.0.1:15001" && rb.Detail != "self" {
			t.Errorf("%s: detail %q, want self", target, rb.Detail)
		}
	}
}

func TestBadRequests(t *testing.T) {
	w := newWorld(t, worldOpts{})
	cases := []struct{ name, raw, detail string }{
		{"CONNECT without port", "CONNECT allowed.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "connect_target"},
		{"CONNECT with port 0", "CONNECT allowed.test:0 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "connect_target"},
		{"CONNECT to a path", "CONNECT /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "connect_target"},
		{"CONNECT with userinfo", "CONNECT user@allowed.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "connect_target"},
		{"origin-form is not a proxy request", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "not_proxy_request"},
		{"userinfo in URL", "GET http://evil.test@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "userinfo"},
		{"unsupported scheme", "GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "scheme"},
		{"zone in IPv6 literal", "GET http://[fe80::1%25eth0]/ HTTP/1.1\r\nHost: x\r\n\r\n", "host"},
		{"CL and TE together", "POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "content_length_and_transfer_encoding"},
		{"obs-fold", "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-A: 1\r\n  folded\r\n\r\n", "obs_fold"},
		{"conflicting Content-Length", "POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcd", "malformed_request"},
		{"space before colon", "POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", "invalid_header_name"},
		{"HTTP/1.0 with Transfer-Encoding", "POST http://allowed.test/ HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "http10_transfer_encoding"},
		{"HTTP/1.0 keep-alive with Transfer-Encoding", "POST http://allowed.test/ HTTP/1.0\r\nHost: allowed.test\r\nConnection: keep-alive\r\nTransfer-Encoding: identity\r\n\r\n" + pipelined, "http10_transfer_encoding"},
		{"two transfer codings", "POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "malformed_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assertRefused(t, w.raw(tc.raw), 400, "bad_request", tc.detail)
		})
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d request(s)", n)
	}
	// The proxy is still serving.
	resp, err := w.client().Get("http://allowed.test/after")
	if err != nil {
		t.Fatal(err)
	}
	decodeEcho(t, resp)
}

func TestOversizedHeadGets431(t *testing.T) {
	w := newWorld(t, worldOpts{limits: func(l *config.Limits) { l.MaxHeaderBytes = 8 << 10 }})
	big := strings.Repeat("a", 16<<10)
	resp := w.raw("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nX-Big: " + big + "\r\n\r\n")
	assertRefused(t, resp, 431, "bad_request", "header_too_large")
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d request(s)", n)
	}
}

// TestTooManyFieldsGets431: a head within limits.max_header_bytes but of more
// fields than proxy.MaxHeadLines allows (each costs far more parsed than sent) is
// refused as too large, whether it fits the read buffer or not; one at the bound
// is served.
func TestTooManyFieldsGets431(t *testing.T) {
	w := newWorld(t, worldOpts{})
	fields := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "Z%x:\r\n", i)
		}
		return b.String()
	}
	for _, n := range []int{proxy.MaxHeadLines, 1000, 12000} {
		resp := w.raw("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n" + fields(n) + "\r\n")
		assertRefused(t, resp, 431, "bad_request", "header_too_large")
	}
	if n := w.Upstream.requests.Load(); n != 0 {
		t.Errorf("upstream saw %d request(s)", n)
	}
	resp := w.raw("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n" + fields(proxy.MaxHeadLines-2) + "\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%d fields: %s, want 200", proxy.MaxHeadLines-1, resp.Status)
	}
}

func TestRebindingIsCheckedOnEveryResolution(t *testing.T) {
	w := newWorld(t, worldOpts{})
	c := w.raw("CONNECT rebind.allowed.test:443 HTTP/1.1\r\nHost: rebind.allowed.test:443\r\n\r\n")
	if c.StatusCode != 200 {
		t.Fatalf("first CONNECT: %d", c.StatusCode)
	}
	resp := w.raw("CONNECT rebind.allowed.test:443 HTTP/1.1\r\nHost: rebind.allowed.test:443\r\n\r\n")
	assertRefused(t, resp, 403, "internal_address", "loopback")
	w.assertNoCanaryHit()
}

func TestRedirectsArePassedBackNotFollowed(t *testing.T) {
	w := newWorld(t, worldOpts{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		http.Redirect(rw, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
	})
	resp, err := w.client().Get("http://allowed.test/redirect")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "http://169.254.169.254/latest/meta-data/" {
		t.Errorf("got %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if n := w.Upstream.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
	w.assertNoCanaryHit()
}

func TestKeepAliveEachRequestDecided(t *testing.T) {
	w := newWorld(t, worldOpts{})
	c, err := net.Dial("tcp", w.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET http://allowed.test/one HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	decodeEcho(t, resp)
	io.WriteString(c, "GET http://evil.test/two HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertRefused(t, resp, 403, "not_allowlisted", "")
	io.WriteString(c, "GET http://www.allowed.test/three HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeEcho(t, resp); got.Host != "www.allowed.test" {
		t.Errorf("third request reached %q", got.Host)
	}
}

func TestStreamingResponseIsNotBuffered(t *testing.T) {
	w := newWorld(t, worldOpts{})
	release := make(chan struct{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(rw, "data: first\n\n")
		rw.(http.Flusher).Flush()
		<-release
		io.WriteString(rw, "data: second\n\n")
	})
	defer close(release)
	resp, err := w.client().Get("http://allowed.test/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
}

func TestUpstreamFailures(t *testing.T) {
	w := newWorld(t, worldOpts{limits: func(l *config.Limits) { l.ResponseHeader = 300 * time.Millisecond }})
	t.Run("connection refused", func(t *testing.T) {
		resp := w.raw("GET http://ports.test:8443/ HTTP/1.1\r\nHost: ports.test\r\n\r\n")
		assertRefused(t, resp, 502, "upstream_unreachable", "")
		resp = w.raw("CONNECT ports.test:8443 HTTP/1.1\r\nHost: ports.test:8443\r\n\r\n")
		assertRefused(t, resp, 502, "upstream_unreachable", "")
	})
	t.Run("timeout", func(t *testing.T) {
		w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) { time.Sleep(time.Second) })
		resp := w.raw("GET http://allowed.test/slow HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		assertRefused(t, resp, 504, "upstream_timeout", "")
	})
	t.Run("upstream certificate from an unknown CA", func(t *testing.T) {
		untrusted := newWorld(t, worldOpts{untrustedUpstream: true})
		resp := untrusted.raw("GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
		assertRefused(t, resp, 502, "upstream_tls", "")
		if n := untrusted.Upstream.requests.Load(); n != 0 {
			t.Errorf("upstream served %d request(s) over an unverified connection", n)
		}
	})
}

// TestMaxConnectionsAnswers503: at limits.max_connections with every connection
// serving a request, a new connection gets 503 overloaded.
func TestMaxConnectionsAnswers503(t *testing.T) {
	w := newWorld(t, worldOpts{limits: func(l *config.Limits) { l.MaxConnections = 1 }})
	release, started := make(chan struct{}), make(chan struct{}, 1)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
	})
	hold, err := net.Dial("tcp", w.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	defer close(release)
	io.WriteString(hold, "GET http://allowed.test/hold HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	<-started
	resp := w.raw("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	assertRefused(t, resp, 503, "overloaded", "")
}

// TestMaxConnectionsEvictsSlowHead: at limits.max_connections, a connection still
// sending its request head, past evictAfter (server.go), gives its slot to a new
// client, and is answered 503 overloaded (evicted_waiting) before it is closed,
// with a log line: a connection egressd accepted is never closed unanswered.
func TestMaxConnectionsEvictsSlowHead(t *testing.T) {
	w := newWorld(t, worldOpts{limits: func(l *config.Limits) { l.MaxConnections = 1 }})
	slow, err := net.Dial("tcp", w.ProxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET http://allowed.test/slow HTTP/1.1\r\nHost: allo")
	time.Sleep(1200 * time.Millisecond) // past evictAfter
	resp := w.raw("GET http://allowed.test/new HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("newcomer: %d %q, want 200 in the slow client's slot", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}
	slow.SetReadDeadline(time.Now().Add(2 * time.Second))
	br := bufio.NewReader(slow)
	evictedResp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("slow connection closed unanswered after its slot was taken: %v", err)
	}
	assertRefused(t, evictedResp, 503, "overloaded", "evicted_waiting")
	var ne net.Error
	if n, err := br.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("slow connection still open after its slot was taken (read %d, %v)", n, err)
	}
	w.waitLog(t, func(l map[string]any) bool { return l["detail"] == "evicted_waiting" && l["reason"] == "overloaded" })
	if n := w.Upstream.requests.Load(); n != 1 {
		t.Errorf("upstream saw %d requests, want 1 (the newcomer's)", n)
	}
}

func TestShutdownDrainsInFlight(t *testing.T) {
	w := newWorld(t, worldOpts{})
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		io.WriteString(rw, "done")
	})
	got := make(chan string, 1)
	go func() {
		resp, err := w.client().Get("http://allowed.test/slow")
		if err != nil {
			got <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- string(b)
	}()
	time.Sleep(100 * time.Millisecond)
	if err := w.Server.Shutdown(contextWithTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "done" {
		t.Errorf("in-flight request got %q", s)
	}
	if _, err := net.DialTimeout("tcp", w.ProxyAddr, time.Second); err == nil {
		t.Error("listener still accepting after shutdown")
	}
}
