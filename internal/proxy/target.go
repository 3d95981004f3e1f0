package proxy

import (
	"errors"
	"net/http"
	"net/netip"

	"github.com/egressd/egressd/internal/allowlist"
)

// locate is the target stage: it reads and checks the request's target (readTarget)
// and removes an h2c upgrade offer, declined: the request is served over HTTP/1.1.
func (x *exchange) locate() error {
	var err error
	x.target, x.scheme, err = x.readTarget()
	dropH2C(x.req.Header)
	return err
}

// readTarget reads the request's target by the connection's mode, and records it:
// the absolute URL's host (explicit); the Host header's name on the original
// destination's port (transparent); the tunnel's target, which the request may not
// contradict (tunnel, refused). It only reads: the address is resolved after the
// decision (upstream.Client.Dial).
func (x *exchange) readTarget() (t allowlist.Target, scheme string, err error) {
	switch x.route.mode {
	case modeExplicit:
		scheme = x.req.URL.Scheme
		t, err = forwardTarget(x.req)
	case modeTransparent:
		scheme = "http"
		t, err = transparentTarget(x.req, x.route.orig)
		if x.req.Method == http.MethodConnect {
			err = badRequest("connect_transparent", errors.New("CONNECT on a transparent listener"))
		}
	default:
		scheme, t = "https", x.route.target
		if x.route.plain {
			scheme = "http"
		}
		err = checkInnerHost(x.req, t, scheme)
	}
	x.rec.Path, x.rec.Scheme = x.req.URL.Path, scheme
	x.rec.setTarget(t)
	return t, scheme, err
}

// forwardTarget reads the destination of an absolute-form request.
func forwardTarget(req *http.Request) (allowlist.Target, error) {
	t, err := allowlist.URLTarget(req.URL)
	if err != nil {
		return t, badRequest(allowlist.URLTargetDetail(err), err)
	}
	return t, nil
}

// checkInnerHost refuses a request inside a tunnel whose Host (HTTP/1.1),
// :authority (HTTP/2) or absolute-form URL names a host other than the tunnel's
// target. Hosts compare by normalised name and effective port.
func checkInnerHost(req *http.Request, t allowlist.Target, scheme string) error {
	if req.Method == http.MethodConnect {
		return badRequest("connect_in_tunnel", errors.New("CONNECT inside a tunnel"))
	}
	port, _ := allowlist.SchemePort(scheme)
	if req.URL.IsAbs() && !sameHost(req.URL.Host, t, port) {
		return deny(allowlist.ReasonHostMismatch, "url")
	}
	if req.Host == "" {
		return badRequest("missing_host", errors.New("request without Host"))
	}
	if !sameHost(req.Host, t, port) {
		return deny(allowlist.ReasonHostMismatch, "host")
	}
	return nil
}

func sameHost(authority string, t allowlist.Target, defaultPort uint16) bool {
	got, err := allowlist.ParseAuthority(authority, defaultPort)
	return err == nil && got.Host == t.Host && got.Port == t.Port
}

// transparentTarget is the policy target of a plain-HTTP request on a transparent
// listener: the Host header's name on the original destination's port.
func transparentTarget(req *http.Request, orig netip.AddrPort) (allowlist.Target, error) {
	if req.Host == "" {
		return allowlist.Target{}, badRequest("missing_host", errors.New("request without Host"))
	}
	t, err := allowlist.ParseAuthority(req.Host, orig.Port())
	if err != nil {
		return t, badHost("host", err)
	}
	if t.Port != orig.Port() {
		t.Port = orig.Port() // the record and the message name the connection's port
		return t, deny(allowlist.ReasonHostMismatch, "port")
	}
	return t, nil
}
