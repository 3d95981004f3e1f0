package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy/upstream"
	"github.com/egressd/egressd/internal/scrub"
)

// The request path, each way in, on one screen (docs/architecture.md has it at
// length). Every HTTP request, whichever way it came in, ends in the same tail,
// exchange.serve; every upstream byte goes through upstream.Client (upstream/client.go).
//
//	accept         Server.accept -> serveConn -> serveIn: a slot, the connection's
//	               memory, a lane for hook calls (server.go) -> conn.serve (conn.go)
//	explicit GET   conn.serveLoop -> readRequest -> conn.handle -> serveHTTP1 -> TAIL
//	               -> h1Side.respond -> writeResponse (all conn.go)
//	CONNECT        conn.handle -> serveConnect -> decideTunnel: decide, record,
//	               plan (tunnel.go) -> acceptTunnel (200) -> checkClientHello ->
//	               spliced: conn.tunnel -> relay; intercepted: serveIntercepted ->
//	               serveLoop -> serveHTTP1 (conn.go) -> TAIL, or HTTP/2 below
//	transparent    serveTransparent -> TLS: serveTransparentTLS -> readClientHello ->
//	TLS            decideTunnel (decide, plan, upstream.Client.Dial) -> conn.tunnel
//	               or serveIntercepted (all tunnel.go); plain HTTP: serveLoop
//	HTTP/2 stream  serveIntercepted -> serveH2 -> h2Handler.ServeHTTP -> TAIL
//	               -> h2Side.respond -> writeResponseRW (all h2.go)
//
//	TAIL           serveRequest -> exchange.serve, its stages in order (this file):
//	  target         locate
//	  hook?          hookMatch -> callHook -> serveHook (hookcall.go)
//	  decide         decide: Policy.DecideRequest, recorded
//	  outbound       outbound: the upstream request, a value of its own
//	  inject         inject: placeholders, headers, scrub set (scrub.go), trailers
//	  forward        forward -> roundTrip -> upstream.Client.RoundTrip
//	  scrub          scrubbed (scrub.go)
//	  refuse         an error becomes the response in refusalFor (refuse.go)
//	record         Record.finish, deferred where the Record was made (record.go)

// exchange is one request on its way through the pipeline: parse and normalise the
// target, decide, prepare the outbound request (strip, inject), forward. The same
// stages serve every connection mode, over HTTP/1.1 or HTTP/2.
type exchange struct {
	snap    *Snapshot
	srv     *Server
	metrics *metrics.Metrics
	budget  *hookBudget     // buffered hook bodies, process-wide
	cut     context.Context // a lane connection's cut (server.go); nil elsewhere
	lane    *conn           // the outer lane connection; nil elsewhere
	role    string          // the listener's role
	req     *http.Request
	rec     *Record
	body    *requestBody
	route   route              // how the request's target is read (conn.go)
	target  allowlist.Target   // the target stage's value (locate)
	scheme  string             // the target's scheme: http or https
	scrub   *scrub.Set         // masks what injection set, in the response (scrub.go)
	wanted  byteRange          // the client's byte range, served from the scrubbed body (scrub.go)
	ph      placeholder.Result // what placeholders became (replacePlaceholders)
	stage   stage              // how far serve got
	preHook bool               // the request is a pre-tool hook call
	// hook is the hook the request calls, and hookOutcome what the runtime is
	// answered (a hook_requests_total outcome), counted once it is written.
	hook        *hooks.Match
	hookOutcome string
	// authIdent is what the request's tunnel presented (conn.authIdent), and
	// ident how the call was told to be the runtime's (hookcall.go).
	authIdent, ident string
	// throttled, when set, refuses the request before anything is decided or
	// forwarded (an HTTP/2 stream beyond the connection's stream rate); a pre-tool
	// hook call gets the fail-closed deny instead.
	throttled error
	// unwatch, when set, stops watching for the client's going away (watchGone);
	// serveRequest calls it before the response is written.
	unwatch func()
	// began is when the client may have begun the request (conn.exchangeStart):
	// where a hook call's deadline runs from.
	began time.Time
}

func newExchange(c *conn, snap *Snapshot, req *http.Request, rec *Record, via route) *exchange {
	rec.Method = req.Method
	return &exchange{snap: snap, srv: c.s, metrics: c.s.metrics, budget: &c.s.hookBuf, cut: c.cutCtx, lane: c.laneRoot,
		role: c.l.cfg.Role, req: req, rec: rec, body: newRequestBody(req), route: via, authIdent: c.authIdent,
		began: c.exchangeStart()}
}

// stage is how far serve got with a request. The HTTP/1 side reads it to know
// whether the connection can carry another request after a refusal.
type stage uint8

const (
	stageTarget  stage = iota // reading the target
	stageLane                 // refused: a lane connection carries only a pre-tool hook call
	stageHook                 // a hook call, answered by egressd (hookcall.go)
	stageRefused              // refused: inside a tunnel accepted only to say why (modeRefused)
	stagePrepare              // deciding and preparing: nothing forwarded, the body unread
	stageForward              // forwarded, or forwarding
)

// clientSide is the client's protocol, as the tail needs it: HTTP/1.x (h1Side,
// conn.go) or HTTP/2 (h2Side, h2.go). respond and refuse report whether the
// connection may carry another request.
type clientSide interface {
	sendContinue() // answers Expect: 100-continue before the body is read
	respond(x *exchange, resp *http.Response) bool
	refuse(x *exchange, err error) bool
}

// serveRequest serves one request through the tail and writes what it returns on
// the client's side.
func serveRequest(ctx context.Context, x *exchange, cs clientSide) bool {
	defer x.body.Close()
	defer func() { x.rec.BytesIn += x.body.n.Load() }() // once the response has ended
	resp, err := x.serve(ctx, cs)
	if x.unwatch != nil {
		x.unwatch()
	}
	if err != nil && ctx.Err() != nil && x.throttled == nil {
		x.rec.refused(clientCancelled(err)) // nobody is left to answer
		return false
	}
	defer x.countHook()
	if err != nil {
		return cs.refuse(x, err)
	}
	defer resp.Body.Close()
	keep := cs.respond(x, resp)
	if err := x.ph.Refused(); err != nil { // the body was cut off after the upstream answered
		x.warnScope(err)
		x.rec.refused(err)
		return false
	}
	return keep
}

// serve is the one request tail of every mode and both protocols, its stages called
// in order: locate the target, hook?, decide, build the outbound request, inject
// and replace, forward, scrub. Requests answered before a decision (a lane
// connection's other requests, a hook call, a throttled stream, a refused tunnel)
// leave after the hook stage. It returns the response for the client, or the error
// that refuses the request (refuse.go).
func (x *exchange) serve(ctx context.Context, cs clientSide) (*http.Response, error) {
	targetErr := x.locate()
	m, hook := x.hookMatch(targetErr)
	x.preHook = hook && m.Event == hooks.EventPre
	switch {
	case x.lane != nil && !x.preHook:
		x.stage = stageLane
		return nil, laneRefusal()
	case hook:
		x.stage = stageHook
		return x.callHook(ctx, m, cs)
	case x.throttled != nil:
		x.stage = stagePrepare // refused before anything is decided or read
		return nil, x.throttled
	case x.route.mode == modeRefused:
		x.stage = stageRefused
		x.rec.Intercepted = true // the tunnel's refusal outranks what locate found
		return nil, x.route.refusal
	}
	x.stage = stagePrepare
	if targetErr != nil {
		return nil, targetErr
	}
	d, err := x.decide()
	if err != nil {
		return nil, err
	}
	out := x.outbound(ctx)
	if err := x.inject(out, d); err != nil {
		return nil, x.blame(err)
	}
	resp, err := x.forward(ctx, out, cs)
	if err != nil {
		return nil, x.blame(err)
	}
	return x.scrubbed(resp), nil
}

// forward is the forward stage: out goes upstream once the client is known to be
// waiting (a client gone by now is never dialled), after the 100 Continue it asked
// for, with the client's body read under limits.stream_idle from now on.
func (x *exchange) forward(ctx context.Context, out *http.Request, cs clientSide) (*http.Response, error) {
	if err := cancelled(ctx); err != nil {
		return nil, err
	}
	if expectsContinue(x.req) {
		cs.sendContinue()
	}
	x.stage = stageForward
	x.body.deadline.forwarding(x.snap.Limits.StreamIdle)
	return x.roundTrip(out)
}

// roundTrip sends out upstream (upstream.Client.RoundTrip). The response's Egressd-*
// fields are removed here, on every path (plain, intercepted, upgrades, hook calls):
// only egressd sets them, and an upstream must not be able to fake Egressd-Reason
// or the fail-closed marker. Trailers, which arrive after the body, are filtered by
// the response writers.
func (x *exchange) roundTrip(out *http.Request) (*http.Response, error) {
	head, err := x.holdResponseHead(out)
	if err != nil {
		return nil, err
	}
	resp, err := x.snap.upstream.RoundTrip(out)
	if err != nil {
		head.release()
		return nil, err
	}
	if fieldCount(resp.Header) >= maxHeadLines {
		resp.Body.Close()
		head.release()
		return nil, errResponseFields
	}
	head.settle(resp)
	removeEgressdHeaders(resp.Header)
	return resp, nil
}

// blame is the error that ends an exchange whose body the stages began to read: a
// placeholder that ended the body the upstream was reading, or the client's body
// failing, outranks the upstream's error it caused.
func (x *exchange) blame(err error) error {
	if refused := x.ph.Refused(); refused != nil {
		x.warnScope(refused)
		return refused
	}
	if bodyErr := x.body.clientError(); bodyErr != nil {
		return bodyErr
	}
	return err
}

// callHook serves a hook call (exchange.serveHook), which reads the body itself.
func (x *exchange) callHook(ctx context.Context, m hooks.Match, cs clientSide) (*http.Response, error) {
	if expectsContinue(x.req) {
		x.body.sendContinue = cs.sendContinue
	}
	refusal := x.route.refusal
	if x.throttled != nil {
		refusal = x.throttled
	}
	return x.serveHook(ctx, m, refusal)
}

// cancelled is clientCancelled when ctx, the request's, has ended: a request whose
// client has gone is never dialled or forwarded.
func cancelled(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return clientCancelled(err)
	}
	return nil
}

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

// removeHopByHop deletes the hop-by-hop fields (allowlist.HopByHop) and every field the Connection header
// names. It runs before anything is added, so a client's "Connection: Authorization"
// can only remove the client's own header, never an injected one.
func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range allowlist.HopByHop {
		delete(h, name)
	}
}

// removeEgressdHeaders deletes every Egressd-* field: only egressd sets them.
func removeEgressdHeaders(h http.Header) {
	for name := range h {
		if len(name) >= 8 && strings.EqualFold(name[:8], "Egressd-") {
			delete(h, name)
		}
	}
}

// upgradeType returns the protocol a request asks to upgrade to, or "".
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(tok), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

// dropH2C removes a client's offer to upgrade to h2c (RFC 7540 §3.2: the Upgrade
// token, any case and version, with HTTP2-Settings and their Connection tokens), so
// the request is served over HTTP/1.1 as a server that ignores the offer would: a
// connection switched to cleartext HTTP/2 would carry requests egressd never
// inspects, and refusing the offer would break curl --http2 on every http:// URL.
// Other upgrades (WebSocket) in the same Upgrade field stay.
func dropH2C(h http.Header) {
	var kept []string
	offered := false
	for _, v := range h["Upgrade"] {
		for _, tok := range strings.Split(v, ",") {
			tok = textproto.TrimString(tok)
			name, _, _ := strings.Cut(tok, "/")
			switch {
			case strings.EqualFold(name, "h2c"):
				offered = true
			case tok != "":
				kept = append(kept, tok)
			}
		}
	}
	if !offered {
		return
	}
	delete(h, "Http2-Settings")
	if len(kept) > 0 {
		h["Upgrade"] = []string{strings.Join(kept, ", ")}
		dropConnectionTokens(h, "http2-settings")
		return
	}
	delete(h, "Upgrade")
	dropConnectionTokens(h, "upgrade", "http2-settings")
}

// dropConnectionTokens removes names from the Connection field's list.
func dropConnectionTokens(h http.Header, names ...string) {
	var kept []string
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			tok = textproto.TrimString(tok)
			if tok != "" && !slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, tok) }) {
				kept = append(kept, tok)
			}
		}
	}
	if delete(h, "Connection"); len(kept) > 0 {
		h["Connection"] = []string{strings.Join(kept, ", ")}
	}
}

// switchesProtocol reports whether req asks to take the connection over (CONNECT,
// or any Upgrade): when it is refused, bytes the client may have sent after it
// belong to the other protocol and are never read as a request.
func switchesProtocol(req *http.Request) bool {
	return req.Method == http.MethodConnect || len(req.Header["Upgrade"]) > 0
}

// acceptsTrailers reports whether the client's TE field names "trailers", the one
// TE value that may travel on (HTTP/2 allows no other; gRPC sends it).
func acceptsTrailers(h http.Header) bool {
	for _, v := range h["Te"] {
		for _, tok := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(textproto.TrimString(tok), ";")
			if strings.EqualFold(textproto.TrimString(name), "trailers") {
				return true
			}
		}
	}
	return false
}

// requestBody is the client's request body as the transport reads it. Close does not
// touch the client connection (net/http's body would drain it without bound), nor wait
// for a read in flight (a placeholder search may leave one pending: it ends with the
// client's next bytes or its deadline); drain, called by the connection loop, reads
// what is left within a bound.
type requestBody struct {
	mu     sync.Mutex
	r      io.Reader
	n      atomic.Int64
	closed atomic.Bool
	eof    bool
	onEOF  func() // runs once, when the body has been read to its end
	// deadline, when set, is armed before each read of the client's body, so a
	// client that stops sending its body mid-way cannot hold the connection (and
	// an upstream one) forever (server.go).
	deadline *bodyDeadline
	// sendContinue, when set, runs once before the first read: it answers the
	// client's Expect: 100-continue, so that the client sends the body egressd
	// is about to read instead of waiting for a 100 first.
	sendContinue func()
	readErr      error // the first error reading the client's body, other than EOF
}

// maxDrain is how much of an unread request body is read to keep the connection.
const maxDrain = 256 << 10

func newRequestBody(req *http.Request) *requestBody {
	if req.Body == nil || req.Body == http.NoBody {
		return &requestBody{r: http.NoBody, eof: true}
	}
	return &requestBody{r: req.Body}
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.sendContinue != nil {
		b.sendContinue()
		b.sendContinue = nil
	}
	b.deadline.arm()
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	if err != nil && err != io.EOF && b.readErr == nil {
		b.readErr = err
	}
	if err == io.EOF && !b.eof {
		b.eof = true
		if b.onEOF != nil {
			b.onEOF()
		}
	}
	return n, err
}

// clientError is the error that reading the client's body ended with, if any: a
// forward that failed because of it is the client's bad request (a malformed chunk,
// a body cut short, a stalled upload), not an upstream failure.
func (b *requestBody) clientError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.readErr == nil {
		return nil
	}
	if isTimeout(b.readErr) {
		return badRequest("body_timeout", b.readErr)
	}
	return badRequest("malformed_body", b.readErr)
}

func (b *requestBody) Close() error {
	b.closed.Store(true)
	return nil
}

// Rewind undoes a transport's Close when nothing has been read: a request that
// failed before any of its body was sent may be sent again (upstream.Rewinder).
func (b *requestBody) Rewind() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n.Load() != 0 || b.readErr != nil {
		return false
	}
	b.closed.Store(false)
	return true
}

// drain reads the rest of the body, up to maxDrain, and reports whether the
// connection's framing is intact for another request.
func (b *requestBody) drain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed.Store(true)
	if b.eof {
		return true
	}
	b.deadline.arm()
	_, err := io.CopyN(io.Discard, b.r, maxDrain)
	return err == io.EOF
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

// Placeholders out of scope in what streams: a request body the upstream is reading
// when the placeholder arrives ends there (placeholder.Result.Refused, checked by
// serve), and so does a switched connection (upgradeSource). Both refuse with
// credential_scope and a WARN, like a placeholder found before forwarding
// (replacePlaceholders).

// warnScope logs a placeholder refused outside its scope, naming the credential (when
// known), the host and the location, never the placeholder.
func (x *exchange) warnScope(err error) {
	var se *placeholder.ScopeError
	if errors.As(err, &se) {
		x.srv.log.Warn().Str("req_id", x.rec.ReqID).Str("credential", se.ID).Str("host", se.Host).
			Str("location", se.Location).Msg("credential placeholder outside its scope refused")
	}
}

// upgradeSource is what the upstream of a connection switched to protocol reads from
// the client: src, ended at the first placeholder (placeholder.Replacer.Upgraded),
// which the record and a WARN then name. serveUpgrade closes both sides on it.
func (x *exchange) upgradeSource(src io.Reader, protocol string) io.Reader {
	if !x.snap.Placeholders.Active() {
		return src
	}
	return &scopedStream{r: x.snap.Placeholders.Upgraded(src, x.target.Host, strings.EqualFold(protocol, "websocket")), x: x}
}

// scopedStream records the placeholder that ended a switched connection.
type scopedStream struct {
	r io.Reader
	x *exchange
}

func (s *scopedStream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	var se *placeholder.ScopeError
	if errors.As(err, &se) {
		s.x.warnScope(err)
		s.x.rec.refused(err)
	}
	return n, err
}

// errPlaceholderMemory refuses a request whose body the budget cannot hold for
// placeholder replacement.
var errPlaceholderMemory = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Placeholders.Detail(),
	Err: errors.New("limits.memory reached: too many request bodies held for placeholder replacement at once")}

// holdPlaceholderBody reserves the buffer replacing placeholders in out's body
// holds: a body of known length up to placeholder.MaxBody is read whole, into one
// buffer of its declared length, before anything is forwarded, so a client that
// declares a megabyte and sends one byte would otherwise make egressd allocate the
// megabyte, once for every request it holds so. The reservation ends with the
// request (out's context). It reports false, reserving nothing, when the budget
// cannot hold it.
func (x *exchange) holdPlaceholderBody(out *http.Request) bool {
	n := out.ContentLength
	if !x.snap.Placeholders.Active() || out.Body == nil || out.Body == http.NoBody || n <= 0 || n > placeholder.MaxBody {
		return true
	}
	return holdBody(x.snap.mem, membudget.Placeholders, out, n)
}

// errHashedBodyMemory refuses a request whose body the budget cannot hold to hash it.
var errHashedBodyMemory = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.AWSBodies.Detail(),
	Err: errors.New("limits.memory reached: too many request bodies held to hash them for SigV4 at once")}

// holdHashedBody returns what reserves the body sigv4 reads whole to hash it (a
// request without X-Amz-Content-Sha256): like a placeholder body, its declared
// length is allocated before a byte of it has come.
func (x *exchange) holdHashedBody(out *http.Request) func(int64) error {
	return func(n int64) error {
		if !holdBody(x.snap.mem, membudget.AWSBodies, out, n) {
			return errHashedBodyMemory
		}
		return nil
	}
}

// holdBody reserves n bytes for h until out's request ends, or reports false.
func holdBody(mem *membudget.Budget, h membudget.Holder, out *http.Request, n int64) bool {
	if !mem.Reserve(h, n) {
		return false
	}
	context.AfterFunc(out.Context(), func() { mem.Release(h, n) })
	return true
}

// errResponseHead refuses a request whose response head the budget cannot hold.
var errResponseHead = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Conns.Detail(),
	Err: errors.New("limits.memory reached: too many responses awaited at once")}

// responseHead is what an awaited response's head holds of the budget (holder
// Conns): while the upstream sends it, as much as the transport accepts
// (limits.max_header_bytes, for the bytes read and the header map built from
// them); once it has come, what it really is, until the response ends.
type responseHead struct {
	mem  *membudget.Budget
	held atomic.Int64
}

// holdResponseHead reserves a response head's bound before out is sent, until the
// response's body is closed or, whatever path the response takes, out's request
// ends. A hook call's is taken even past the limit: its answer is egressd's to give.
func (x *exchange) holdResponseHead(out *http.Request) (*responseHead, error) {
	h := &responseHead{mem: x.snap.mem}
	n := 2 * int64(x.snap.Limits.MaxHeaderBytes)
	if x.hook != nil {
		h.mem.Take(membudget.Conns, n)
	} else if !h.mem.Reserve(membudget.Conns, n) {
		return nil, errResponseHead
	}
	h.held.Store(n)
	context.AfterFunc(out.Context(), h.release)
	return h, nil
}

// settle shrinks the reservation to resp's head and gives it back when resp's
// body is closed (at once for a switched connection, whose body is the
// connection itself and must keep its type).
func (h *responseHead) settle(resp *http.Response) {
	keep := 2 * headerSize(resp.Header)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		keep = 0
	}
	if n := h.held.Load() - keep; n > 0 {
		h.held.Add(-n)
		h.mem.Release(membudget.Conns, n)
	}
	if keep > 0 && resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &releasingBody{ReadCloser: resp.Body, release: h.release}
		return
	}
	h.release()
}

// release gives back what is still held, once.
func (h *responseHead) release() {
	if n := h.held.Swap(0); n > 0 {
		h.mem.Release(membudget.Conns, n)
	}
}

// errResponseFields refuses a response whose head has more fields than a request's
// may (maxHeadLines): each costs far more parsed than sent, and a response is held
// until it ends.
var errResponseFields = &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: "response_header_count",
	Err: errors.New("the upstream's response head has too many fields")}

// fieldCount is the number of h's field lines.
func fieldCount(h http.Header) int {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	return n
}

// headerSize is the bytes of h's names and values, as sent.
func headerSize(h http.Header) int64 {
	var n int64
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

// releasingBody calls release when the body is closed.
type releasingBody struct {
	io.ReadCloser
	release func()
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// bodyDeadline arms the read deadline of a client's request body: per read by
// default, or one deadline for the whole body (a hook call, which egressd reads
// itself and must answer within the hook's timeout). expire ends every wait at
// once and for good: the hook's deadline passed or the call was cut short.
type bodyDeadline struct {
	set     func(time.Time) error // the connection's or stream's read deadline
	perRead time.Duration
	until   time.Time // when set, the deadline of the whole body
	expired atomic.Bool
}

// forwarding lengthens each later read's wait to idle (limits.stream_idle) once the
// body is being streamed to the upstream: a forwarded stream (a bidirectional gRPC
// call, a long upload) that is merely quiet is not cut by the deadline meant for
// heads and for bodies egressd reads itself. A whole-body deadline (a hook call's)
// stays. Call it before the transport reads the body.
func (d *bodyDeadline) forwarding(idle time.Duration) {
	if d != nil && d.until.IsZero() {
		d.perRead = idle
	}
}

// expiredDeadline is a deadline in the past: a read with it fails at once.
var expiredDeadline = time.Unix(1, 0)

// arm sets the deadline for the next read. A concurrent expire wins: it is
// checked again after the deadline is set.
func (d *bodyDeadline) arm() {
	if d == nil || d.set == nil {
		return
	}
	next := time.Now().Add(d.perRead)
	if !d.until.IsZero() {
		next = d.until
	}
	if d.expired.Load() {
		next = expiredDeadline
	}
	d.set(next)
	if d.expired.Load() {
		d.set(expiredDeadline)
	}
}

// expire makes the current and every later read fail with a timeout. It may run
// on any goroutine, while a read waits.
func (d *bodyDeadline) expire() {
	if d == nil || d.set == nil {
		return
	}
	d.expired.Store(true)
	d.set(expiredDeadline)
}

// expireOn runs expire when ctx ends and returns the function that disarms it.
// That function waits for an expire already under way, so nothing touches the
// connection or the HTTP/2 stream once the caller has returned: after an HTTP/2
// handler ends, its stream's deadline setter must never run again (net/http
// would dereference a released stream and crash the process).
func (d *bodyDeadline) expireOn(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	disarm := context.AfterFunc(ctx, func() {
		defer close(done)
		d.expire()
	})
	return func() {
		if !disarm() {
			<-done
		}
	}
}
