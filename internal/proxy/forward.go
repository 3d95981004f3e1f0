package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
)

// serveForward serves an absolute-form request (GET http://host/path): decide on the
// URL's host, forward on a connection dialled to a checked address, stream the
// response back. It reports whether the connection may carry another request.
func (c *conn) serveForward(rt *Runtime, req *http.Request, rec *Record) bool {
	body := newRequestBody(req)
	defer body.Close()
	wantClose := req.Close || req.ProtoMajor < 1 || (req.ProtoMajor == 1 && req.ProtoMinor == 0)
	t, err := forwardTarget(req, rec)
	if err == nil {
		err = decide(rt, t, req.URL.Scheme, rec)
	}
	if err != nil {
		c.writeRefusal(rt, rec, err, 0)
		return !wantClose && body.drain()
	}
	if expectsContinue(req) {
		c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		c.bw.Flush()
	}
	out := outbound(c.ctx, req, t, body, rec)
	resp, err := rt.transport.RoundTrip(out)
	if err != nil {
		c.writeRefusal(rt, rec, err, 0)
		return false
	}
	defer resp.Body.Close()
	rec.BytesIn = body.n.Load()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		c.serveUpgrade(resp, rec)
		return false
	}
	keep, err := writeResponse(c.bw, req.Method, wantClose, resp, rec)
	rec.BytesIn = body.n.Load()
	return err == nil && keep && body.drain()
}

// forwardTarget reads the destination of an absolute-form request.
func forwardTarget(req *http.Request, rec *Record) (allowlist.Target, error) {
	u := req.URL
	rec.Scheme, rec.Path = u.Scheme, u.Path
	if !u.IsAbs() || u.Host == "" {
		return allowlist.Target{}, badRequest("not_proxy_request", errors.New("request target is not an absolute URL"))
	}
	if u.User != nil {
		return allowlist.Target{}, badRequest("userinfo", errors.New("userinfo in request URL"))
	}
	var port uint16
	switch u.Scheme {
	case "http":
		port = 80
	case "https":
		port = 443
	default:
		return allowlist.Target{}, badRequest("scheme", errors.New("unsupported scheme "+u.Scheme))
	}
	t, err := allowlist.ParseAuthority(u.Host, port)
	if err != nil {
		return t, badRequest("host", err)
	}
	rec.setTarget(t)
	return t, nil
}

// decide applies the allowlist to t and records the verdict.
// scheme is the request's scheme; "" for a tunnel, whose bytes egressd does not see.
func decide(rt *Runtime, t allowlist.Target, scheme string, rec *Record) error {
	d := rt.Policy.DecideRequest(t, scheme)
	rec.setDecision(d)
	if !d.Allowed() {
		return deny(d.Reason, d.Detail)
	}
	return nil
}

// outbound turns the client's request into the upstream request, in place: the
// target is the decided, normalised one; hop-by-hop and Egressd-* headers are gone.
func outbound(ctx context.Context, req *http.Request, t allowlist.Target, body *requestBody, rec *Record) *http.Request {
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { rec.setResolved(i.Conn.RemoteAddr()) }}
	out := req.WithContext(httptrace.WithClientTrace(ctx, trace))
	out.URL.Host = t.String()
	out.Host = hostHeader(t, out.URL.Scheme)
	out.RequestURI = ""
	out.Close = false
	out.Body = body
	if req.ContentLength == 0 {
		out.Body = http.NoBody
	}
	upgrade := upgradeType(req.Header)
	removeHopByHop(out.Header)
	if upgrade != "" {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", upgrade)
	}
	out.Header.Del("Expect")
	removeEgressdHeaders(out.Header)
	return out
}

// hostHeader is the Host the upstream sees: the target, without the scheme's default port.
func hostHeader(t allowlist.Target, scheme string) string {
	if (scheme == "http" && t.Port == 80) || (scheme == "https" && t.Port == 443) {
		if t.IsIP() && t.Addr.Is6() {
			return "[" + t.Host + "]"
		}
		return t.Host
	}
	return t.String()
}

func expectsContinue(req *http.Request) bool {
	return strings.EqualFold(req.Header.Get("Expect"), "100-continue") && req.ContentLength != 0
}
