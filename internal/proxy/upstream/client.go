// Package upstream is egressd's side towards the upstreams: it dials decided targets
// through the address guard and sends outbound requests over HTTP/1.1 (a pool of
// its own for bodiless GETs and HEADs, net/http's Transport for the rest) or HTTP/2,
// as net/http's Transport is to its Server. It never decides: every dial is of the
// target the request's context carries (WithTarget), and what it connected to is
// reported through httptrace (GotConn).
package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
)

// Options is what a Client dials and verifies with.
type Options struct {
	Guard    *netguard.Guard
	Resolver *netguard.Resolver
	// TLS verifies upstream certificates; nil means the system roots.
	// InsecureSkipVerify is never set.
	TLS *tls.Config
	// Limits: dns, dial (TCP and TLS handshake), response_header and upstream_idle.
	Limits config.Limits
	// StreamWindow and ConnWindow bound what the HTTP/2 transport buffers of an
	// upstream's response, per stream and per connection, before it is read.
	StreamWindow, ConnWindow int
	// HoldWindow, when set, is asked before a request goes out on the HTTP/2
	// transport: it reserves the stream's window elsewhere (a memory budget) or
	// refuses the request with its error. release is called once, when the
	// response body ends or at once when there is none to buffer; a nil release
	// holds nothing.
	HoldWindow func(ctx context.Context) (release func(), err error)
}

// Client sends outbound requests and dials tunnels. It is safe for concurrent use.
type Client struct {
	o      Options
	dialer *netguard.Dialer
	// h2 speaks HTTP/2 to upstreams that offer it (for HTTP/2 clients: gRPC,
	// trailers); h1 speaks HTTP/1.1 only, for HTTP/1.x clients, so each client
	// connection maps onto a keep-alive upstream connection of its own rather than
	// every client sharing one multiplexed stream.
	h2, h1 *http.Transport
	// pool serves HTTP/1.x GETs and HEADs without a body (h1pool.go).
	pool *h1Pool
	// h2Only remembers the upstreams that refused ALPN http/1.1 .
	h2Only h2OnlySet
}

// New builds a Client.
func New(o Options) *Client {
	c := &Client{o: o, dialer: o.Guard.NewDialer(o.Limits.Dial)}
	c.h2 = c.newTransport(true)
	c.h1 = c.newTransport(false)
	c.pool = newH1Pool(c)
	return c
}

// RoundTrip sends out, whose context carries its decided target (WithTarget), on
// the transport that matches its protocol: HTTP/2 for an HTTP/2 client's request,
// HTTP/1.1 for the rest, or HTTP/2 again to an upstream that speaks only that. A
// 101 to a request that asked for no protocol switch is refused (ErrSwitched).
func (c *Client) RoundTrip(out *http.Request) (*http.Response, error) {
	var resp *http.Response
	var err error
	if out.ProtoMajor >= 2 {
		resp, err = c.viaTransport(c.h2, out, nil)
	} else {
		resp, err = c.sendH1(out)
	}
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols && len(out.Header["Upgrade"]) == 0 {
		resp.Body.Close() // the Transport's 101: never tunnelled unasked
		return nil, ErrSwitched
	}
	return resp, nil
}

// ErrSwitched is a 101 to a request that named no protocol in an Upgrade: RFC 9110
// §15.2.2 lets a server switch only to one it named.
var ErrSwitched = errors.New("upstream switched protocols on a request without Upgrade")

// sendH1 forwards an HTTP/1.x client's request over HTTP/1.1, or over HTTP/2 to an
// upstream known or found to speak only that. It is found so by its TLS alert
// no_application_protocol (ALPN http/1.1 refused), or, on a fresh connection whose
// handshake confirmed no protocol, by closing without answering (grpc-go's
// servers complete such a handshake, then close).
func (c *Client) sendH1(out *http.Request) (*http.Response, error) {
	if c.h2Only.has(out.URL.Host) {
		return c.sendH2Only(out, nil)
	}
	var resp *http.Response
	var err error
	var declined atomic.Bool
	if h1Eligible(out) {
		resp, err = c.pool.roundTrip(out)
	} else {
		resp, err = c.viaTransport(c.h1, out, &declined)
	}
	if err != nil && out.URL.Scheme == "https" &&
		(refusedHTTP1(err) || errors.Is(err, errUnanswered) || (declined.Load() && isClosed(err))) {
		return c.sendH2Only(out, err)
	}
	return resp, err
}

// viaTransport forwards out on tr; declined, when not nil, is set if a TLS
// handshake for it confirmed no ALPN protocol. A request on the HTTP/2 transport
// holds its stream's window (Options.HoldWindow) while its response body is open.
func (c *Client) viaTransport(tr *http.Transport, out *http.Request, declined *atomic.Bool) (*http.Response, error) {
	if declined != nil {
		trace := &httptrace.ClientTrace{TLSHandshakeDone: func(st tls.ConnectionState, err error) {
			if err == nil && st.NegotiatedProtocol == "" {
				declined.Store(true)
			}
		}}
		out = out.WithContext(httptrace.WithClientTrace(out.Context(), trace))
	}
	if tr != c.h2 || c.o.HoldWindow == nil {
		return tr.RoundTrip(out)
	}
	release, err := c.o.HoldWindow(out.Context())
	switch {
	case err != nil:
		return nil, err
	case release == nil:
		return tr.RoundTrip(out)
	}
	resp, err := tr.RoundTrip(out)
	return keepWindow(release, resp, err)
}

// keepWindow ties a held window to resp's body, or releases it when there is none
// to buffer: a failed round trip, an HTTP/1.1 answer, a protocol switch.
func keepWindow(release func(), resp *http.Response, err error) (*http.Response, error) {
	if err != nil || resp.ProtoMajor != 2 || resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == http.NoBody {
		release()
		return resp, err
	}
	resp.Body = &heldBody{ReadCloser: resp.Body, release: sync.OnceFunc(release)}
	return resp, nil
}

// heldBody releases its window when the body ends or is closed, whichever is first.
type heldBody struct {
	io.ReadCloser
	release func()
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

func (b *heldBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// newTransport builds one upstream transport. It is not a Clone of the other:
// Transport.Clone settles the HTTP/2 defaults first and would copy "h2" into the
// HTTP/1.1 transport's ALPN list.
func (c *Client) newTransport(h2 bool) *http.Transport {
	tlsConf := c.tlsConfig()
	tr := &http.Transport{
		// Never follow HTTP_PROXY/HTTPS_PROXY from egressd's own environment.
		Proxy:       nil,
		DialContext: c.dialGuarded,
		// Compression is the client's business: asking for gzip and decompressing
		// would change what the sandbox receives.
		DisableCompression:     true,
		TLSClientConfig:        tlsConf,
		ForceAttemptHTTP2:      h2,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        c.o.Limits.UpstreamIdle,
		TLSHandshakeTimeout:    c.o.Limits.Dial,
		ResponseHeaderTimeout:  c.o.Limits.ResponseHeader,
		MaxResponseHeaderBytes: c.maxResponseHead(),
	}
	if h2 {
		tr.HTTP2 = &http.HTTP2Config{
			MaxReceiveBufferPerStream:     c.o.StreamWindow,
			MaxReceiveBufferPerConnection: c.o.ConnWindow,
		}
	} else {
		tlsConf.NextProtos = []string{"http/1.1"}
		// A non-nil, empty TLSNextProto turns HTTP/2 off (net/http's documented switch).
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return tr
}

// tlsConfig is a fresh copy of the upstream TLS policy.
func (c *Client) tlsConfig() *tls.Config {
	if c.o.TLS != nil {
		return c.o.TLS.Clone()
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// CloseIdle releases the Client's idle upstream connections.
func (c *Client) CloseIdle() {
	c.h2.CloseIdleConnections()
	c.h1.CloseIdleConnections()
	c.pool.closeIdle()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

// maxResponseHead bounds an upstream's response head, its 1xx responses included,
// on every path (the pool and both Transports refuse the same heads): the bound
// on a client's request head (limits.max_header_bytes), where net/http's default
// would let each response in flight hold 10 MiB outside the memory budget, for
// the proxy reserves this much of it for every response it waits for.
func (c *Client) maxResponseHead() int64 {
	if n := int64(c.o.Limits.MaxHeaderBytes); n > 0 {
		return n
	}
	return defaultMaxResponseHead
}

// defaultMaxResponseHead is limits.max_header_bytes's default, for a Client built
// without limits (tests).
const defaultMaxResponseHead = 64 << 10

// DialError marks an error that happened while connecting, so that a connect
// timeout reads as upstream_unreachable rather than upstream_timeout.
type DialError struct{ Err error }

func (e *DialError) Error() string { return e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// resolve turns a decided target into checked addresses: an IP literal is checked as
// is, a name is resolved once and every answer checked.
func (c *Client) resolve(ctx context.Context, t allowlist.Target) ([]netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.Limits.DNS)
	defer cancel()
	return c.o.Guard.Resolve(ctx, c.o.Resolver, t.Host, t.Addr, t.Port)
}

// Dial resolves, checks and dials t, a decided target. The dialer checks each
// address again in its Control hook, so nothing unchecked is ever connected to.
func (c *Client) Dial(ctx context.Context, t allowlist.Target) (net.Conn, error) {
	addrs, err := c.resolve(ctx, t)
	if err != nil {
		return nil, err
	}
	conn, err := c.dialer.DialAddrs(ctx, addrs)
	if err != nil {
		var blocked *netguard.BlockedError
		if errors.As(err, &blocked) {
			return nil, err
		}
		return nil, &DialError{err}
	}
	return conn, nil
}

// targetKey is the request-context key of the target a request was decided on.
type targetKey struct{}

// WithTarget returns ctx carrying t, the decided target: the only one the Client
// will connect to for a request with that context.
func WithTarget(ctx context.Context, t allowlist.Target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

// ErrNoTarget is a dial whose context carries no decided target: refused, never
// dialled by its address alone.
var ErrNoTarget = errors.New("dial without a decided target")

// decidedTarget is the target in ctx, which must be the one addr (the URL's
// host:port, from which the transports key their connections) was written from.
func decidedTarget(ctx context.Context, addr string) (allowlist.Target, error) {
	t, ok := ctx.Value(targetKey{}).(allowlist.Target)
	if !ok {
		return allowlist.Target{}, ErrNoTarget
	}
	if t.String() != addr {
		return allowlist.Target{}, fmt.Errorf("dial of %s for a request decided on %s", addr, t)
	}
	return t, nil
}

// dialGuarded is the transports' DialContext: it dials the decided target that the
// request's context carries (WithTarget), resolved and checked, and nothing else.
func (c *Client) dialGuarded(ctx context.Context, _, addr string) (net.Conn, error) {
	t, err := decidedTarget(ctx, addr)
	if err != nil {
		return nil, err
	}
	return c.Dial(ctx, t)
}

// An HTTP/1.x client's request to an upstream that speaks only HTTP/2 (its TLS
// server refuses ALPN http/1.1 with no_application_protocol) is sent again over
// HTTP/2, as Envoy does with an auto upstream protocol: the connection was made and
// the upstream is willing, only the framing differs, and a refusal ("could not
// connect") would be untrue and leave an HTTP/1.1-only client no way through.
// The response is written to the client in HTTP/1.1 as usual. What HTTP/2 cannot
// carry, an Upgrade (WebSocket over HTTP/1.1), is refused with ErrHTTP2Only, which
// the proxy answers as upstream_unreachable with detail http2_only.

// ErrHTTP2Only is a request that an upstream speaking only HTTP/2 cannot be sent:
// an Upgrade, or a body already partly sent over HTTP/1.1.
var ErrHTTP2Only = errors.New("the upstream accepts only HTTP/2")

// errUnanswered marks a fresh upstream connection whose TLS handshake confirmed no
// ALPN protocol and that closed before answering an HTTP/1.1 request.
var errUnanswered = errors.New("the upstream confirmed no ALPN protocol and closed without answering HTTP/1.1")

// refusedHTTP1 reports whether err is the upstream's TLS alert
// no_application_protocol: it offers no protocol egressd's HTTP/1.1 ALPN named.
func refusedHTTP1(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error" && op.Err != nil &&
		op.Err.Error() == "tls: no application protocol"
}

// sendH2Only sends out over HTTP/2 to an upstream that refused HTTP/1.1 (cause, or
// nil when it is already known to) and remembers it. A request that HTTP/2 cannot
// carry (an Upgrade), or whose body was already sent, gets ErrHTTP2Only; the
// client's retry then goes over HTTP/2.
func (c *Client) sendH2Only(out *http.Request, cause error) (*http.Response, error) {
	c.h2Only.add(out.URL.Host)
	if len(out.Header["Upgrade"]) > 0 || !rewind(out.Body) {
		if cause == nil {
			return nil, ErrHTTP2Only
		}
		return nil, fmt.Errorf("%w: %w", ErrHTTP2Only, cause)
	}
	return c.viaTransport(c.h2, out, nil)
}

// Rewinder is a request body that can be sent again when nothing has been read
// from it: Rewind reopens it and reports whether it could.
type Rewinder interface{ Rewind() bool }

// rewind reports whether body can be sent again: none, or a Rewinder with nothing
// read from it yet (the failed attempt ended at the TLS handshake).
func rewind(body any) bool {
	if body == http.NoBody || body == nil {
		return true
	}
	b, ok := body.(Rewinder)
	return ok && b.Rewind()
}

// h2OnlySet is the set of upstreams (host:port) that refused HTTP/1.1, bounded so
// that a wildcard entry cannot grow it without limit; beyond the bound an upstream
// costs one refused handshake per request.
type h2OnlySet struct {
	m sync.Map
	n atomic.Int32
}

const maxH2Only = 1024

func (s *h2OnlySet) has(addr string) bool {
	_, ok := s.m.Load(addr)
	return ok
}

func (s *h2OnlySet) add(addr string) {
	if s.has(addr) || s.n.Add(1) > maxH2Only {
		return
	}
	s.m.Store(addr, struct{}{})
}
