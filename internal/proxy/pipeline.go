package proxy

import (
	"context"
	"net/http"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/scrub"
)

// The request path, each way in, on one screen (docs/architecture.md has it at
// length). Every HTTP request, whichever way it came in, ends in the same tail,
// exchange.serve; every upstream byte goes through upstream.Client.
//
//	explicit GET   Server.accept (server.go) -> conn.serveLoop -> readRequest
//	               (head.go) -> conn.handle (conn.go) -> serveHTTP1 (h1.go) -> TAIL
//	               -> h1Side.respond -> writeResponse (respond.go)
//	CONNECT        conn.handle -> serveConnect (connect.go) -> decideTunnel (mode.go)
//	               -> acceptTunnel (200) -> checkClientHello (tlspeek.go) -> spliced:
//	               conn.tunnel (tunnel.go); intercepted: serveIntercepted
//	               (intercept.go) -> serveLoop -> serveHTTP1 -> TAIL, or HTTP/2 below
//	transparent    serveTransparent (transparent.go) -> TLS: readClientHello ->
//	TLS            decideTunnel (mode.go: decide, plan, upstream.Client.Dial) ->
//	               conn.tunnel (tunnel.go) or serveIntercepted; plain HTTP: serveLoop
//	HTTP/2 stream  serveIntercepted -> serveH2 -> h2Handler.ServeHTTP (h2.go) -> TAIL
//	               -> h2Side.respond -> writeResponseRW (respond.go)
//
//	TAIL           serveRequest -> exchange.serve, its stages in order:
//	  target         locate (target.go)
//	  hook?          hookMatch -> callHook -> serveHook (hookcall.go)
//	  decide         decide: Policy.DecideRequest, recorded (prepare.go)
//	  outbound       outbound: the upstream request, a value of its own (prepare.go)
//	  inject         inject: placeholders, headers, scrub set, trailers (prepare.go)
//	  forward        forward -> roundTrip -> upstream.Client.RoundTrip (upstream/)
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
	route   route              // how the request's target is read (mode.go)
	target  allowlist.Target   // the target stage's value (locate)
	scheme  string             // the target's scheme: http or https
	scrub   *scrub.Set         // masks what injection set, in the response (scrub.go)
	wanted  byteRange          // the client's byte range, served from the scrubbed body (ranges.go)
	ph      placeholder.Result // what placeholders became (prepare.go)
	stage   stage              // how far serve got
	preHook bool               // the request is a pre-tool hook call
	// hook is the hook the request calls, and hookOutcome what the runtime is
	// answered (a hook_requests_total outcome), counted once it is written.
	hook        *hooks.Match
	hookOutcome string
	// authIdent is what the request's tunnel presented (conn.authIdent), and
	// ident how the call was told to be the runtime's (identify.go).
	authIdent, ident string
	// throttled, when set, refuses the request before anything is decided or
	// forwarded (an HTTP/2 stream beyond the connection's stream rate); a pre-tool
	// hook call gets the fail-closed deny instead.
	throttled error
	// unwatch, when set, stops watching for the client's going away (watchGone);
	// serveRequest calls it before the response is written.
	unwatch func()
}

func newExchange(c *conn, snap *Snapshot, req *http.Request, rec *Record, via route) *exchange {
	rec.Method = req.Method
	return &exchange{snap: snap, srv: c.s, metrics: c.s.metrics, budget: &c.s.hookBuf, cut: c.cutCtx, lane: c.laneRoot,
		role: c.l.cfg.Role, req: req, rec: rec, body: newRequestBody(req), route: via, authIdent: c.authIdent}
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
// h1.go) or HTTP/2 (h2Side, h2.go). respond and refuse report whether the
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
