package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/scrub"
)

// exchange is one request on its way through the pipeline: parse and normalise the
// target, decide, prepare the outbound request (strip, inject), forward. The same
// stages serve the explicit listener and the requests inside an intercepted tunnel,
// whether they arrive over HTTP/1.1 or HTTP/2.
type exchange struct {
	rt      *Runtime
	srv     *Server
	metrics *metrics.Metrics
	budget  *hookBudget     // buffered hook bodies, process-wide
	cut     context.Context // a lane connection's cut (lane.go); nil elsewhere
	lane    *conn           // the outer lane connection; nil elsewhere
	req     *http.Request
	rec     *Record
	body    *requestBody
	pinned  *allowlist.Target // the CONNECT target inside an intercepted tunnel
	orig    netip.AddrPort    // the original destination on a transparent listener
	target  allowlist.Target
	scheme  string // set by locate
	located bool
	locErr  error
	scrub   *scrub.Set // masks what injection set, in the response (scrub.go)
}

func newExchange(c *conn, rt *Runtime, req *http.Request, rec *Record, pinned *allowlist.Target) *exchange {
	rec.Method = req.Method
	return &exchange{rt: rt, srv: c.s, metrics: c.s.metrics, budget: &c.s.hookBuf, cut: c.cutCtx, lane: c.laneRoot, req: req, rec: rec, body: newRequestBody(req), pinned: pinned, orig: c.orig}
}

// locate reads and checks the request's target once.
func (x *exchange) locate() error {
	if !x.located {
		x.located = true
		x.scheme, x.locErr = x.resolveTarget()
		// bad_request is the first check (DESIGN.md): an h2c upgrade outranks a
		// host mismatch, not another malformation.
		if x.locErr == nil || classify(x.locErr).Reason != allowlist.ReasonBadRequest {
			if err := checkUpgrade(x.req.Header); err != nil {
				x.locErr = err
			}
		}
	}
	return x.locErr
}

// prepare runs every stage before forwarding and returns the outbound request, or
// the refusal that ends the exchange.
func (x *exchange) prepare(ctx context.Context) (*http.Request, error) {
	if err := x.locate(); err != nil {
		return nil, err
	}
	scheme := x.scheme
	d := x.rt.Policy.DecideRequest(x.target, scheme)
	x.rec.setDecision(d)
	if x.pinned != nil {
		x.rec.Intercepted = true
	}
	if !d.Allowed() {
		return nil, deny(d.Reason, d.Detail)
	}
	if d.Rule != nil && d.Rule.Injects() && reflectsRequest(x.req) {
		return nil, deny(allowlist.ReasonMethodNotAllowed, strings.ToLower(x.req.Method))
	}
	out := x.outbound(ctx, scheme)
	if d.Rule != nil && d.Rule.Injects() {
		narrowForScrub(out.Header)
	}
	res, err := x.rt.Injector.Apply(d.Rule, out.Header, x.req.Trailer)
	if err != nil {
		return nil, err
	}
	x.rec.Injected, x.rec.Credential, x.rec.CredentialVersion = res.Names, res.Credential, res.Version
	x.scrub = res.Scrub
	if err := x.replacePlaceholders(out, d.Rule, res.Names); err != nil {
		return nil, err
	}
	x.body.trailers(x.req, out, res.Names)
	return out, nil
}

// replacePlaceholders swaps environment_variable placeholders for their values where
// their credentials allow it, and refuses the request (credential_scope, with a WARN
// naming the credential and the host) where a placeholder appears anywhere else.
func (x *exchange) replacePlaceholders(out *http.Request, rule *allowlist.Rule, injected []string) error {
	pr, err := x.rt.Placeholders.Apply(out, x.target.Host, rule, x.scheme == "http")
	var se *placeholder.ScopeError
	if errors.As(err, &se) {
		x.srv.log.Warn().Str("req_id", x.rec.ReqID).Str("credential", se.ID).Str("host", se.Host).
			Str("location", se.Location).Msg("credential placeholder outside its scope refused")
	}
	if err != nil || len(pr.IDs) == 0 {
		return err
	}
	if reflectsRequest(x.req) {
		return deny(allowlist.ReasonMethodNotAllowed, strings.ToLower(x.req.Method))
	}
	narrowForScrub(out.Header)
	x.scrub = x.rt.Placeholders.ScrubSet(out.Header, injected, pr)
	if x.rec.Credential == "" {
		x.rec.Credential = pr.IDs[0] // the log line names the credential whose value went out
	}
	return nil
}

// reflectsRequest reports whether the request asks the upstream to send it back:
// TRACE (and IIS's TRACK), whatever the case a server might accept it in, and
// OPTIONS * (asterisk form, which some servers answer with the request echoed).
// An injecting entry refuses them before anything is injected or forwarded.
func reflectsRequest(req *http.Request) bool {
	m := req.Method
	if strings.EqualFold(m, http.MethodTrace) || strings.EqualFold(m, "TRACK") {
		return true
	}
	return strings.EqualFold(m, http.MethodOptions) && (req.URL.Path == "*" || req.RequestURI == "*")
}

// resolveTarget sets x.target: the absolute URL's host on the explicit listener; the
// pinned CONNECT target inside a tunnel, where the request may not name another.
func (x *exchange) resolveTarget() (string, error) {
	u := x.req.URL
	x.rec.Path = u.Path
	if x.orig.IsValid() && x.pinned == nil {
		t, err := transparentTarget(x.req, x.orig)
		x.target, x.rec.Scheme = t, "http"
		x.rec.setTarget(t)
		if x.req.Method == http.MethodConnect {
			err = badRequest("connect_transparent", errors.New("CONNECT on a transparent listener"))
		}
		return "http", err
	}
	if x.pinned == nil {
		t, err := forwardTarget(x.req)
		x.target = t
		x.rec.Scheme = u.Scheme
		x.rec.setTarget(t)
		return u.Scheme, err
	}
	x.target, x.rec.Scheme = *x.pinned, "https"
	x.rec.setTarget(x.target)
	return "https", checkInnerHost(x.req, x.target)
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
func checkInnerHost(req *http.Request, t allowlist.Target) error {
	if req.Method == http.MethodConnect {
		return badRequest("connect_in_tunnel", errors.New("CONNECT inside a tunnel"))
	}
	if req.URL.IsAbs() && !sameHost(req.URL.Host, t) {
		return deny(allowlist.ReasonHostMismatch, "url")
	}
	if req.Host == "" {
		return badRequest("missing_host", errors.New("request without Host"))
	}
	if !sameHost(req.Host, t) {
		return deny(allowlist.ReasonHostMismatch, "host")
	}
	return nil
}

func sameHost(authority string, t allowlist.Target) bool {
	got, err := allowlist.ParseAuthority(authority, allowlist.PortHTTPS)
	return err == nil && got.Host == t.Host && got.Port == t.Port
}

// outbound turns the client's request into the upstream request, in place: the
// target is the decided, normalised one; hop-by-hop and Egressd-* headers are gone.
// Injection comes after, so nothing the client sends can strip what egressd adds.
func (x *exchange) outbound(ctx context.Context, scheme string) *http.Request {
	out := x.req.WithContext(ctx)
	u := *x.req.URL
	u.Scheme, u.Host, u.User = scheme, x.target.String(), nil
	out.URL = &u
	out.Host = hostHeader(x.target, scheme)
	out.RequestURI = ""
	out.Close = false
	out.Body = x.body
	if x.req.ContentLength == 0 {
		out.Body = http.NoBody
	}
	out.Header = x.req.Header
	upgrade := upgradeType(out.Header)
	trailers := acceptsTrailers(out.Header)
	removeHopByHop(out.Header)
	if upgrade != "" {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", upgrade)
	}
	if trailers { // gRPC servers may insist on it (RFC 9113 §8.2.2 lets it through)
		out.Header["Te"] = []string{"trailers"}
	}
	out.Header.Del("Expect")
	removeEgressdHeaders(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		// net/http's transports (and Request.Write, which the pool uses) add
		// "Go-http-client/..." when the key is absent; present and empty, they
		// send none. egressd adds no header of its own.
		out.Header["User-Agent"] = nil
	}
	return out
}

// hostHeader is the Host the upstream sees: the target, without the scheme's default port.
func hostHeader(t allowlist.Target, scheme string) string {
	if port, _ := allowlist.SchemePort(scheme); t.Port != port {
		return t.String()
	}
	if t.IsIP() && t.Addr.Is6() {
		return "[" + t.Host + "]"
	}
	return t.Host
}

func expectsContinue(req *http.Request) bool {
	return strings.EqualFold(req.Header.Get("Expect"), "100-continue") && req.ContentLength != 0
}

// trailers arranges for the client's request trailers to reach the upstream without
// any injected name and without Egressd-* or hop-by-hop fields. The declared names
// are filtered now (HTTP/2 upstreams announce trailers with the request head) and
// the values when the body ends, which is when the transport writes them.
func (b *requestBody) trailers(in, out *http.Request, injected []string) {
	if in.Trailer == nil {
		out.Trailer = nil
		return
	}
	out.Trailer = filterTrailer(in.Trailer, injected)
	b.onEOF = func() {
		clear(out.Trailer)
		for k, v := range filterTrailer(in.Trailer, injected) {
			out.Trailer[k] = v
		}
	}
}

// filterTrailer copies t without the injected names and the fields only egressd or
// the connection may set.
func filterTrailer(t http.Header, injected []string) http.Header {
	out := t.Clone()
	for _, name := range injected {
		inject.Remove(out, name)
	}
	removeHopByHop(out)
	removeEgressdHeaders(out)
	return out
}
