package upstream

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

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
