package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/idna"

	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// ioTimeout bounds every client read and write of a case.
const ioTimeout = 10 * time.Second

// world is one scenario's fixture: a stub DNS server, one egressd run on a config
// naming it, and the shared upstreams and canaries (fixtures).
type world struct {
	*egressd
	fx  *fixtures
	DNS *dnsstub.Server
	// roots trusts egressd's interception CA and the upstream CA: intercepted
	// tunnels are terminated by egressd, spliced ones by the upstream.
	roots *x509.CertPool
}

// strictAllowlist is the main policy: names only, one entry per way to match.
var strictAllowlist = []egressdtest.Entry{
	{Domain: "allowed.test"},
	{Domain: "*.allowed.test"},
	{Domain: "api.allowed.test", Credential: "api", // intercepted: credential and transform
		Transform: map[string]string{"X-Injected": staticValue}},
	{Domain: "plain.allowed.test", Credential: "api", // the same over plain http, on purpose
		Transform: map[string]string{"X-Injected": staticValue}, AllowPlaintext: true},
	{Domain: "ports.test", Ports: []int{8443}},
	{Domain: "bücher.test"}, // an IDN, written in Unicode
}

// starAllowlist matches every host, IP literals included: only the address guard
// stands between a request and an internal address.
var starAllowlist = []egressdtest.Entry{{Domain: "*"}}

// newWorld starts a world whose egressd runs on c; c.allowlist defaults to the
// strict allowlist and c.resolver to the world's DNS stub.
func newWorld(t *testing.T, c config) *world {
	t.Helper()
	fx := getFixtures(t)
	w := &world{fx: fx, DNS: dnsstub.Start(t)}
	w.setNames()
	if c.allowlist == nil {
		c.allowlist = strictAllowlist
	}
	if c.resolver == "" {
		c.resolver = w.DNS.Addr
	}
	w.egressd = startEgressd(t, fx, c)
	w.roots = w.caPool()
	w.roots.AddCert(fx.upstreamCA.Cert)
	return w
}

// setNames loads the stub DNS with every name the cases use.
func (w *world) setNames() {
	for _, n := range []string{"allowed.test", "www.allowed.test", "api.allowed.test", "plain.allowed.test",
		"ports.test", "xn--bcher-kva.test"} {
		w.DNS.Set(n, "A "+publicIP)
	}
	for _, n := range []string{"evil.test", "other.test", "www.evil.test", "bucher.test", lookalikeASCII,
		"allowed.test.evil.test", "allowed.testevil.test"} {
		w.DNS.Set(n, "A "+forbiddenIP)
	}
	w.DNS.Set("loopback.allowed.test", "A 127.0.0.1")
	w.DNS.Set("metadata.allowed.test", "A 169.254.169.254")
	w.DNS.Set("private.allowed.test", "A 10.0.0.5")
	w.DNS.Set("cgnat.allowed.test", "A 100.64.0.5")
	w.DNS.Set("mixed.allowed.test", "A "+publicIP, "A 10.0.0.5")
	w.DNS.Set("mixed6.allowed.test", "A "+publicIP, "AAAA ::1")
	w.DNS.Set("cname.allowed.test", "CNAME inside.elsewhere.test.")
	w.DNS.Set("inside.elsewhere.test", "A 10.0.0.5")
	w.DNS.Set("cname-meta.allowed.test", "CNAME meta.elsewhere.test.")
	w.DNS.Set("meta.elsewhere.test", "A 169.254.169.254")
	w.DNS.Set("aaaa-loopback.allowed.test", "AAAA ::1")
	w.DNS.Set("aaaa-metadata.allowed.test", "AAAA fd00:ec2::254")
	w.DNS.Set("aaaa-mapped.allowed.test", "AAAA ::ffff:127.0.0.1")
	w.DNS.Set("aaaa-nat64.allowed.test", "AAAA 64:ff9b::a9fe:a9fe")
	w.DNS.Set("self.test", "A 127.0.0.1")
	// rebind.allowed.test answers its first A query with the public address and every
	// later one with loopback; flip.allowed.test alternates (TTL 0 throughout: the
	// stub never lets an answer be cached).
	w.DNS.SetFunc("rebind.allowed.test", func(n int) []string {
		if n == 0 {
			return []string{"A " + publicIP}
		}
		return []string{"A 127.0.0.1"}
	})
	w.DNS.SetFunc("flip.allowed.test", func(n int) []string {
		if n%2 == 0 {
			return []string{"A " + publicIP}
		}
		return []string{"A 169.254.169.254"}
	})
	w.DNS.SetFunc("unbind.allowed.test", func(n int) []string {
		if n == 0 {
			return []string{"A 10.0.0.5"}
		}
		return []string{"A " + publicIP}
	})
}

// kase is one conformance case in progress. begin registers the checks every case
// makes when it ends: no canary and not the forbidden upstream saw a connection,
// the allowlisted upstream never saw a credential host's request without the
// credential, and the secret appears neither in what the client read nor in
// egressd's output.
type kase struct {
	t          *testing.T
	w          *world
	sinks      sinkCounts
	echoSeen   int
	echoNoCred int64
	seen       syncbuf.Buffer // every byte the client read from egressd, TLS decrypted
}

func (w *world) begin(t *testing.T) *kase {
	t.Helper()
	k := &kase{t: t, w: w, sinks: snapshotSinks(w.fx.allSinks()), echoSeen: w.fx.echo.Count(),
		echoNoCred: w.fx.echo.withoutSecret.Load()}
	t.Cleanup(k.finish)
	return k
}

func (k *kase) finish() {
	t := k.t
	t.Helper()
	for s, before := range k.sinks {
		c, b := s.conns.Load()-before[0], s.bytes.Load()-before[1]
		if c != 0 || b != 0 {
			t.Errorf("%s saw %d connection(s) and %d byte(s)", s.name, c, b)
			if bytes.Contains(s.received(), []byte(secret)) {
				t.Errorf("%s received the secret", s.name)
			}
		}
	}
	if n := k.w.fx.echo.withoutSecret.Load() - k.echoNoCred; n != 0 {
		t.Errorf("the upstream saw %d request(s) to a credential host without exactly the credential", n)
	}
	if bytes.Contains(k.seen.Bytes(), []byte(secret)) {
		t.Errorf("the client read the secret from egressd")
	}
	if k.w.leaked() {
		t.Errorf("the secret appears in egressd's output")
	}
}

// upstreamSaw returns the requests the echo upstream received during the case.
func (k *kase) upstreamSaw() []echoed { return k.w.fx.echo.Since(k.echoSeen) }

// assertUpstreamSaw fails unless the echo upstream received exactly n requests.
func (k *kase) assertUpstreamSaw(n int) []echoed {
	k.t.Helper()
	got := k.upstreamSaw()
	if len(got) != n {
		k.t.Errorf("the upstream saw %d request(s), want %d: %+v", len(got), n, got)
	}
	return got
}

// conn is a client connection to egressd whose reads are recorded on the case.
type conn struct {
	net.Conn
	br *bufio.Reader
}

type recordingConn struct {
	net.Conn
	k *kase
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.k.seen.Write(p[:n])
	return n, err
}

// dial opens a new TCP connection to egressd's sandbox listener.
func (k *kase) dial() *conn {
	k.t.Helper()
	nc, err := net.DialTimeout("tcp", k.w.ProxyAddr, 2*time.Second)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(ioTimeout))
	return k.wrap(nc)
}

// wrap records what is read from nc. Reads on the result go through its buffer.
func (k *kase) wrap(nc net.Conn) *conn {
	rc := &recordingConn{Conn: nc, k: k}
	return &conn{Conn: rc, br: bufio.NewReader(rc)}
}

func (c *conn) Read(p []byte) (int, error) { return c.br.Read(p) }

// send writes raw bytes on c.
func (k *kase) send(c *conn, raw string) {
	k.t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		k.t.Fatalf("writing %q: %v", raw, err)
	}
}

// response reads one response from c, as the answer to a request of method.
func (k *kase) response(c *conn, method string) *http.Response {
	k.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		k.t.Fatalf("reading a response: %v", err)
	}
	return resp
}

// raw sends raw on a new connection and reads the response.
func (k *kase) raw(raw string) *http.Response {
	k.t.Helper()
	c := k.dial()
	k.send(c, raw)
	method, _, _ := strings.Cut(raw, " ")
	return k.response(c, method)
}

// connect opens a CONNECT tunnel to authority and returns it once egressd said 200.
func (k *kase) connect(authority string) *conn {
	k.t.Helper()
	c := k.dial()
	k.send(c, "CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n")
	resp := k.response(c, http.MethodConnect)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		k.t.Fatalf("CONNECT %s: %d %s", authority, resp.StatusCode, b)
	}
	return c
}

// tlsOver runs a TLS client handshake over c with server name sni and alpn.
func (k *kase) tlsOver(c *conn, sni string, alpn ...string) (*tls.Conn, error) {
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: k.w.roots, NextProtos: alpn})
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	return tc, tc.HandshakeContext(ctx)
}

// intercepted opens an intercepted HTTP/1.1 tunnel to host:443; what the client
// reads inside it is recorded in plain text.
func (k *kase) intercepted(host string) *conn {
	k.t.Helper()
	tc, err := k.tlsOver(k.connect(host+":443"), host, "http/1.1")
	if err != nil {
		k.t.Fatalf("TLS in a tunnel to %s: %v", host, err)
	}
	tc.SetDeadline(time.Now().Add(ioTimeout))
	return k.wrap(tc)
}

// client is an HTTP client that uses egressd as its proxy and follows no redirect.
func (k *kase) client() *http.Client {
	pu, _ := url.Parse("http://" + k.w.ProxyAddr)
	var d net.Dialer
	return &http.Client{
		Transport: &http.Transport{
			Proxy: http.ProxyURL(pu),
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				nc, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &recordingConn{Conn: nc, k: k}, nil
			},
			TLSClientConfig:   &tls.Config{RootCAs: k.w.roots},
			ForceAttemptHTTP2: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       ioTimeout,
	}
}

// get fetches rawURL through egressd.
func (k *kase) get(rawURL string) *http.Response {
	k.t.Helper()
	c := k.client()
	k.t.Cleanup(c.CloseIdleConnections)
	resp, err := c.Get(rawURL)
	if err != nil {
		k.t.Fatalf("GET %s: %v", rawURL, err)
	}
	return resp
}

// h2 opens an HTTP/2-only client connection to authority through a CONNECT tunnel;
// requests on it may name any :authority.
func (k *kase) h2(authority string) *http.ClientConn {
	k.t.Helper()
	tr := k.client().Transport.(*http.Transport)
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP2(true)
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	cc, err := tr.NewClientConn(ctx, "https", authority)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { cc.Close() })
	return cc
}

// body reads resp's body whole, recording headers and body on the case.
func (k *kase) body(resp *http.Response) []byte {
	k.t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		k.t.Fatalf("reading the body of a %d: %v", resp.StatusCode, err)
	}
	var h bytes.Buffer
	resp.Header.Write(&h)
	resp.Trailer.Write(&h)
	k.seen.Write(h.Bytes())
	k.seen.Write(b)
	return b
}

// refusalBody is the JSON body of an egressd-made response.
type refusalBody = egressdtest.Refusal

// refused asserts an egressd-made refusal: the status, Egressd-Reason, and the
// JSON body's reason (and detail, when not empty).
func (k *kase) refused(resp *http.Response, status int, reason, detail string) refusalBody {
	k.t.Helper()
	body := k.body(resp)
	var rb refusalBody
	if err := json.Unmarshal(body, &rb); err != nil {
		k.t.Fatalf("status %d, Egressd-Reason %q, body not JSON: %q; want %d %s",
			resp.StatusCode, resp.Header.Get("Egressd-Reason"), body, status, reason)
	}
	if resp.StatusCode != status || resp.Header.Get("Egressd-Reason") != reason || rb.Reason != reason {
		k.t.Fatalf("got %d, Egressd-Reason %q, body reason %q (detail %q); want %d %s",
			resp.StatusCode, resp.Header.Get("Egressd-Reason"), rb.Reason, rb.Detail, status, reason)
	}
	if detail != "" && rb.Detail != detail {
		k.t.Errorf("detail %q, want %q", rb.Detail, detail)
	}
	if rb.RequestID == "" || rb.Message == "" {
		k.t.Errorf("body lacks request_id or message: %s", body)
	}
	return rb
}

// echo asserts a 200 from the echo upstream and returns what it received.
func (k *kase) echo(resp *http.Response) echoed {
	k.t.Helper()
	body := k.body(resp)
	if resp.StatusCode != http.StatusOK {
		k.t.Fatalf("status %d (Egressd-Reason %q): %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"), body)
	}
	var e echoed
	if err := json.Unmarshal(body, &e); err != nil {
		k.t.Fatalf("not an echo: %q", body)
	}
	return e
}

// assertInjected fails unless h carries the credential and the transform exactly
// once each, as the echo upstream reports them.
func (k *kase) assertInjected(h http.Header) {
	k.t.Helper()
	if v := h.Values("Authorization"); len(v) != 1 || v[0] != "Bearer "+secretMark {
		k.t.Errorf("upstream Authorization = %q, want exactly the injected credential", v)
	}
	if v := h.Values("X-Injected"); len(v) != 1 || v[0] != staticMark {
		k.t.Errorf("upstream X-Injected = %q, want exactly the transform's value", v)
	}
}

// assertClosed fails unless egressd closes c (EOF or reset) within d.
// isClosedWithin reports whether egressd closes c within d (what it sends
// meanwhile is read and dropped).
func (k *kase) isClosedWithin(c *conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

func (k *kase) assertClosed(c *conn, d time.Duration) time.Duration {
	k.t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			k.t.Fatalf("connection still open after %s", d)
		}
		return time.Since(start)
	}
}

// lookalikeASCII is the punycode of "аllowed.test" with a Cyrillic а (U+0430).
const lookalikeUnicode = "\u0430llowed.test"

var lookalikeASCII = mustToASCII(lookalikeUnicode)

func mustToASCII(s string) string {
	a, err := idna.Lookup.ToASCII(s)
	if err != nil {
		panic(err)
	}
	return a
}

// sleepTick is one step of a bounded wait.
func sleepTick() { time.Sleep(10 * time.Millisecond) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
