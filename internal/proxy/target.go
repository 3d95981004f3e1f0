package proxy

import (
	"errors"
	"net/http"
	"net/netip"

	"github.com/egressd/egressd/internal/allowlist"
)

// locate reads and checks the request's target once.
func (x *exchange) locate() error {
	if !x.located {
		x.located = true
		x.scheme, x.locErr = x.readTarget()
		dropH2C(x.req.Header) // a declined offer: the request is served over HTTP/1.1
	}
	return x.locErr
}

// readTarget sets x.target by the connection's mode: the absolute URL's host
// (explicit); the Host header's name on the original destination's port
// (transparent); the tunnel's target, which the request may not contradict (tunnel,
// refused). It only reads: the address is resolved after the decision (dial.go).
func (x *exchange) readTarget() (string, error) {
	var scheme string
	var err error
	switch x.route.mode {
	case modeExplicit:
		scheme = x.req.URL.Scheme
		x.target, err = forwardTarget(x.req)
	case modeTransparent:
		scheme = "http"
		x.target, err = transparentTarget(x.req, x.route.orig)
		if x.req.Method == http.MethodConnect {
			err = badRequest("connect_transparent", errors.New("CONNECT on a transparent listener"))
		}
	default:
		scheme, x.target = "https", x.route.target
		if x.route.plain {
			scheme = "http"
		}
		err = checkInnerHost(x.req, x.target, scheme)
	}
	x.rec.Path, x.rec.Scheme = x.req.URL.Path, scheme
	x.rec.setTarget(x.target)
	return scheme, err
}

// forwardTarget reads the destination of an absolute-form request.
func forwardTarget(req *http.Request) (allowlist.Target, error) {
	t, err := allowlist.URLTarget(req.URL)
	switch {
	case errors.Is(err, allowlist.ErrNotAbsolute):
		return t, badRequest("not_proxy_request", err)
	case errors.Is(err, allowlist.ErrUserinfo):
		return t, badRequest("userinfo", err)
	case errors.Is(err, allowlist.ErrScheme):
		return t, badRequest("scheme", err)
	case err != nil:
		return t, badHost("host", err)
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
