package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/proxy/upstream"
)

// prepare runs every stage before forwarding and returns the outbound request, or
// the refusal that ends the exchange.
func (x *exchange) prepare(ctx context.Context) (*http.Request, error) {
	if err := x.locate(); err != nil {
		return nil, err
	}
	scheme := x.scheme
	d := x.snap.Policy.DecideRequest(x.target, scheme)
	x.rec.setDecision(d)
	if x.route.inTunnel() {
		x.rec.Intercepted = true
	}
	if !d.Allowed() {
		return nil, deny(d.Reason, d.Detail)
	}
	if d.Rule != nil && d.Rule.Injects() && reflectsRequest(x.req) {
		return nil, deny(allowlist.ReasonMethodNotAllowed, strings.ToLower(x.req.Method))
	}
	out := x.outbound(ctx, scheme)
	// Placeholders first: a placeholder in a header the entry injects would otherwise
	// be removed with the client's copy of that header, unseen, rather than refused.
	if err := x.replacePlaceholders(out, d.Rule); err != nil {
		return nil, err
	}
	res, err := x.snap.Injector.Apply(d.Rule, out.Header, x.req.Trailer)
	if err != nil {
		return nil, err
	}
	x.rec.Injected, x.rec.CredentialVersion = res.Names, res.Version
	if res.Credential != "" {
		x.rec.Credential = res.Credential
	}
	x.scrubFor(out, res.Scrub)
	x.body.trailers(x.req, out, res.Names)
	// Last: a SigV4 signature covers the headers as they leave.
	if err := res.Sign(ctx, out, x.target.Host, x.snap.Placeholders); err != nil {
		return nil, err
	}
	return out, nil
}

// replacePlaceholders swaps environment_variable placeholders for their values where
// their credentials allow it, and refuses the request (credential_scope, with a WARN
// naming the credential and the host) where a placeholder appears anywhere else. A
// streamed body is searched as the upstream reads it (x.ph.Refused), a WebSocket as
// it runs (upgradeSource): frames must stay uncompressed for that, so an upgrade
// offers no extension.
func (x *exchange) replacePlaceholders(out *http.Request, rule *allowlist.Rule) error {
	if !x.holdPlaceholderBody(out) {
		return errPlaceholderMemory
	}
	pr, err := x.snap.Placeholders.Apply(out, x.target.Host, rule, x.scheme == "http")
	x.ph = pr
	if err != nil {
		x.warnScope(err)
		return err
	}
	if x.snap.Placeholders.Active() && upgradeType(x.req.Header) != "" {
		inject.Remove(out.Header, "Sec-WebSocket-Extensions")
	}
	if len(pr.IDs) == 0 {
		return nil
	}
	if reflectsRequest(x.req) {
		return deny(allowlist.ReasonMethodNotAllowed, strings.ToLower(x.req.Method))
	}
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

// outbound builds the upstream request from the client's as a value of its own
// (httputil.ProxyRequest's Out): its own URL and header map, so that what egressd
// removes or sets for the upstream (hop-by-hop fields, Expect, injected headers) never
// changes the request the client is answered for (Expect: 100-continue) or the
// record. The target is the decided, normalised one (in the URL, and as a value in
// the context for the upstream client's dialer: upstream.WithTarget), and the
// address the client connects to comes back through httptrace (gotConn). Injection
// comes after, so nothing the client sends can strip what egressd adds.
func (x *exchange) outbound(ctx context.Context, scheme string) *http.Request {
	ctx = upstream.WithTarget(ctx, x.target)
	if x.hook != nil {
		ctx = context.WithValue(ctx, hookCallKey{}, true)
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: x.gotConn})
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
	out.Header = x.req.Header.Clone()
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

// gotConn records the address the upstream client connected to for the request.
func (x *exchange) gotConn(info httptrace.GotConnInfo) {
	x.rec.setResolved(info.Conn.RemoteAddr())
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
