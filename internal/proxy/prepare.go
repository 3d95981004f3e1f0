package proxy

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/proxy/upstream"
)

// decide is the decision stage: the policy's Decision on the target, recorded
// (Record.setDecision); a denial is refused with the Decision's reason. An entry
// that injects also refuses a request that asks the upstream to send it back
// (reflectsRequest), before anything is injected.
func (x *exchange) decide() (allowlist.Decision, error) {
	d := x.snap.Policy.DecideRequest(x.target, x.scheme)
	x.rec.setDecision(d)
	if x.route.inTunnel() {
		x.rec.Intercepted = true
	}
	if !d.Allowed() {
		return d, deny(d.Reason, d.Detail)
	}
	if d.Rule != nil && d.Rule.Injects() && reflectsRequest(x.req) {
		return d, deny(allowlist.ReasonMethodNotAllowed, strings.ToLower(x.req.Method))
	}
	return d, nil
}

// inject is the stage that fills out for the entry d allowed: placeholders replaced
// where their credentials allow it, the entry's headers injected, the scrub set for
// the response built, the client's trailers filtered. Placeholders come first: one
// in a header the entry injects would otherwise be removed with the client's copy
// of that header, unseen, rather than refused.
func (x *exchange) inject(out *http.Request, d allowlist.Decision) error {
	if err := x.replacePlaceholders(out, d.Rule); err != nil {
		return err
	}
	x.snap.Injector.Await(out.Context(), d.Rule) // a first read still in flight after a start
	res, err := x.snap.Injector.Apply(d.Rule, out.Header, x.req.Trailer)
	if err != nil {
		return err
	}
	x.rec.Injected, x.rec.CredentialVersion = res.Names, res.Version
	if res.Credential != "" {
		x.rec.Credential = res.Credential
	}
	if res.GitHub && inject.RevokesGitHubToken(out.URL.Path) {
		return deny(allowlist.ReasonCredentialScope, inject.DetailGitHubRevoke)
	}
	x.scrubFor(out, res)
	x.body.trailers(x.req, out, res.Names)
	// Last: a SigV4 signature covers the headers as they leave.
	return res.Sign(out.Context(), out, x.target.Host, x.snap.Placeholders, x.holdHashedBody(out))
}

// prepare is decide, outbound and inject for a hook call, whose body egressd has
// read first (forwardHook).
func (x *exchange) prepare(ctx context.Context) (*http.Request, error) {
	d, err := x.decide()
	if err != nil {
		return nil, err
	}
	out := x.outbound(ctx)
	return out, x.inject(out, d)
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

// outbound is the stage that builds the upstream request from the client's, as a
// value of its own (httputil.ProxyRequest's Out): its own URL, header map and body
// wrapper, and nothing else of the client's request, so that what egressd removes
// or sets for the upstream (hop-by-hop fields, Expect, injected headers) never
// changes the request the client is answered for (Expect: 100-continue) or the
// record. The header map is the client's without hop-by-hop and Egressd-* fields.
// The target is the decided, normalised one (in the URL, and as a value in the
// context for the upstream client's dialer: upstream.WithTarget), and the address
// the client connects to comes back through httptrace (gotConn). Injection comes
// after, so nothing the client sends can strip what egressd adds.
func (x *exchange) outbound(ctx context.Context) *http.Request {
	u := *x.req.URL
	u.Scheme, u.Host, u.User = x.scheme, x.target.String(), nil
	out := &http.Request{
		Method: x.req.Method, URL: &u, Host: hostHeader(x.target, x.scheme),
		Proto: x.req.Proto, ProtoMajor: x.req.ProtoMajor, ProtoMinor: x.req.ProtoMinor,
		Header: outboundHeader(x.req.Header), Body: x.body, ContentLength: x.req.ContentLength,
		TransferEncoding: slices.Clone(x.req.TransferEncoding),
		Trailer:          x.req.Trailer.Clone(), // the declared names, for placeholders; inject filters them
	}
	if x.req.ContentLength == 0 {
		out.Body = http.NoBody
	}
	ctx = upstream.WithTarget(ctx, x.target)
	if x.hook != nil {
		ctx = context.WithValue(ctx, hookCallKey{}, true)
	}
	return out.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: x.gotConn}))
}

// outboundHeader is the client's header without hop-by-hop fields (the Upgrade
// it asks for and a trailers-only TE set again), Expect and Egressd-* fields.
func outboundHeader(in http.Header) http.Header {
	h := in.Clone()
	upgrade := upgradeType(h)
	trailers := acceptsTrailers(h)
	removeHopByHop(h)
	if upgrade != "" {
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", upgrade)
	}
	if trailers { // gRPC servers may insist on it (RFC 9113 §8.2.2 lets it through)
		h["Te"] = []string{"trailers"}
	}
	h.Del("Expect")
	removeEgressdHeaders(h)
	if _, ok := h["User-Agent"]; !ok {
		// net/http's transports (and Request.Write, which the pool uses) add
		// "Go-http-client/..." when the key is absent; present and empty, they
		// send none. egressd adds no header of its own.
		h["User-Agent"] = nil
	}
	return h
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
