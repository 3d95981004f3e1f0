package proxy

import (
	"context"
	"net/http"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/metrics"
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
	route   route // how the request's target is read (mode.go)
	target  allowlist.Target
	scheme  string // set by locate
	located bool
	locErr  error
	scrub   *scrub.Set // masks what injection set, in the response (scrub.go)
}

func newExchange(c *conn, rt *Runtime, req *http.Request, rec *Record, rtt route) *exchange {
	rec.Method = req.Method
	return &exchange{rt: rt, srv: c.s, metrics: c.s.metrics, budget: &c.s.hookBuf, cut: c.cutCtx, lane: c.laneRoot, req: req, rec: rec, body: newRequestBody(req), route: rtt}
}
