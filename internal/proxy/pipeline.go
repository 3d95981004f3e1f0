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

// The request path, every mode and both protocols (docs/architecture.md has it at
// length):
//
//	accept    Server.Serve -> accept: a slot (slots.go, lane.go), a conn (conn.go)
//	mode      conn.route, fixed before the first request (mode.go)
//	head      conn.serveLoop -> readRequest (head.go); HTTP/2: serveH2 (h2.go)
//	tunnel    conn.handle -> serveConnect (connect.go) or serveTransparentTLS
//	          (transparent.go) -> planTunnel: splice (tunnel.go) or intercept.go
//	request   serveHTTP1 (h1.go) or h2Handler (h2.go) -> serveRequest:
//	  target    exchange.locate (target.go)
//	  hook?     exchange.hookMatch -> serveHook (hookcall.go)
//	  decide    exchange.prepare: Policy.DecideRequest, outbound, inject (prepare.go)
//	  forward   Snapshot.roundTrip (forward.go) -> dialGuarded (dial.go)
//	  scrub     exchange.scrubbed (scrub.go)
//	  respond   clientSide.respond or .refuse (h1.go, h2.go; refuse.go)
//	record    Record.finish, deferred where the Record was made (record.go)

// exchange is one request on its way through the pipeline: parse and normalise the
// target, decide, prepare the outbound request (strip, inject), forward. The same
// stages serve every connection mode, over HTTP/1.1 or HTTP/2.
type exchange struct {
	snap    *Snapshot
	srv     *Server
	metrics *metrics.Metrics
	budget  *hookBudget     // buffered hook bodies, process-wide
	cut     context.Context // a lane connection's cut (lane.go); nil elsewhere
	lane    *conn           // the outer lane connection; nil elsewhere
	role    string          // the listener's role
	req     *http.Request
	rec     *Record
	body    *requestBody
	route   route // how the request's target is read (mode.go)
	target  allowlist.Target
	scheme  string // set by locate
	located bool
	locErr  error
	scrub   *scrub.Set         // masks what injection set, in the response (scrub.go)
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

// serve is the one request tail of every mode and both protocols: hook check,
// refused check, decide and prepare, round trip, scrub. It returns the response for
// the client, or the error that refuses the request (refuse.go).
func (x *exchange) serve(ctx context.Context, cs clientSide) (*http.Response, error) {
	m, hook := x.hookMatch(x.role)
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
		return nil, x.refusedInTunnel()
	}
	x.stage = stagePrepare
	out, err := x.prepare(ctx)
	if err == nil {
		err = cancelled(ctx)
	}
	if err == nil {
		if expectsContinue(x.req) {
			cs.sendContinue()
		}
		x.stage = stageForward
		x.body.deadline.forwarding(x.snap.Limits.StreamIdle)
		var resp *http.Response
		if resp, err = x.snap.forward(out); err == nil {
			return x.scrubbed(resp), nil
		}
	}
	if refused := x.ph.Refused(); refused != nil {
		x.warnScope(refused)
		err = refused // a placeholder ended the body the upstream was reading
	} else if bodyErr := x.body.clientError(); bodyErr != nil {
		err = bodyErr // the client's body failed, not the upstream
	}
	return nil, err
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

// refusedInTunnel records a request inside a refused tunnel and returns its refusal.
func (x *exchange) refusedInTunnel() error {
	x.locate() // records the tunnel's target; the refusal outranks what it finds
	x.rec.Intercepted = true
	return x.route.refusal
}
