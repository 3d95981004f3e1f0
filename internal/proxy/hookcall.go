package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/pkg/hookauth"
)

// Hook outcome label values of hook_requests_total.
const (
	hookAllow      = "allow"         // the endpoint allowed
	hookDeny       = "deny"          // the endpoint denied
	hookFailClosed = "failed_closed" // egressd answered deny in the endpoint's place
	hookForwarded  = "forwarded"     // a post-tool call, signed and forwarded
	hookFailed     = "failed"        // a post-tool call that could not be forwarded
)

// HookOutcomes are the outcome label values exported from the start.
var HookOutcomes = []string{hookAllow, hookDeny, hookFailClosed, hookForwarded, hookFailed}

// Hooks is what a Snapshot knows about the agent runtime's hook calls.
type Hooks struct {
	Index      *hooks.Index
	Signer     *hooks.Signer
	FailClosed bool // hooks.fail_closed: pre-tool failures become an explicit deny
	// Identify is how the runtime's calls are told from the sandbox's
	// (identify.go): config.IdentifyListener (only a hooks listener's traffic),
	// IdentifyRuntimeAuth (traffic that presents RuntimeToken) or IdentifyURL
	// (any traffic to a hook URL).
	Identify string
	// RuntimeToken returns hooks.runtime_auth's token; an error when it cannot
	// be had.
	RuntimeToken func() ([]byte, error)
}

// hookCallKey marks the context of a hook call's outbound request: its answer is
// read into the hook share (hookbuf.go), not held in an HTTP/2 window (server.go).
type hookCallKey struct{}

func isHookCall(ctx context.Context) bool { return ctx.Value(hookCallKey{}) != nil }

// hookMatch is the hook stage: it reports whether the request, whose target was
// read without error (targetErr), is a hook call: a POST to the URL of an http hook
// of an enabled group that egressd can tell is the runtime's (x.ident).
func (x *exchange) hookMatch(targetErr error) (hooks.Match, bool) {
	h := x.snap.Hooks
	if h == nil || h.Index == nil || x.req.Method != http.MethodPost || targetErr != nil {
		return hooks.Match{}, false
	}
	authIdent := x.authIdent
	if authIdent == "" {
		authIdent = h.authIdent(x.req.Header)
	}
	if x.ident = h.callIdent(x.role, authIdent); x.ident == "" {
		return hooks.Match{}, false
	}
	return h.Index.Lookup(x.scheme, x.target.Host, x.target.Port, x.req.URL.EscapedPath())
}

// serveHook serves one hook call and returns the response for the client. The body is
// read (bounded), signed and forwarded as read. A pre-tool call with fail_closed is
// answered within the hook's timeout minus a margin, and every way it can fail —
// egressd's own refusal included — becomes 200 {"decision":"deny"}; a well-formed
// allow or deny is answered from the bytes egressd checked (validatedAnswer). The
// outcome is left on the exchange, to be counted once the answer is written.
func (x *exchange) serveHook(ctx context.Context, m hooks.Match, prepErr error) (*http.Response, error) {
	x.rec.HookGroup, x.rec.HookEvent = m.Group, m.Event
	x.hook = &m
	failClosed := m.Event == hooks.EventPre && x.snap.Hooks.FailClosed
	deadline := time.Now().Add(hooks.Deadline(m.Timeout))
	if failClosed {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	ctx, stopCut, prepErr := x.laneCut(ctx, prepErr)
	defer stopCut()
	// egressd reads the body itself: the whole of it must arrive within the hook's
	// deadline (not limits.read_header per read, which a trickle could stretch
	// without end), and a call cut short stops waiting for it at once.
	if d := x.body.deadline; d != nil {
		d.until = deadline
		defer d.expireOn(ctx)()
	}
	resp, err := x.forwardHook(ctx, m, prepErr)
	switch {
	case err == nil && failClosed:
		var answer *http.Response
		if answer, x.hookOutcome, err = x.validatedAnswer(resp); err == nil {
			return answer, nil
		}
	case err == nil:
		answer := x.scrubbed(resp.Response)
		x.hookOutcome = hookForwarded
		if answer != resp.Response {
			x.hookOutcome = hookFailed // refused: a body the scrubber cannot read
		}
		return answer, nil
	}
	if !failClosed {
		x.hookOutcome = hookFailed
		return nil, err // the caller writes the refusal
	}
	x.hookOutcome = hookFailClosed
	rf := classify(err)
	x.rec.fail(rf.Reason, rf.Detail)
	x.rec.Error = err.Error()
	return denyResponse(hookFailure(err)), nil
}

// validatedAnswer is the pre-tool answer for the runtime, made from the decision
// bytes egressd read: masked with the request's scrub set, then checked
// (hooks.Verdict), and sent as checked, in identity encoding with its own
// Content-Length. The endpoint's Content-Encoding is dropped, not decoded: a label
// egressd cannot decode ("none", "UTF-8", "br" on plain JSON) would otherwise make
// the scrubber refuse a deny or cut it mid-body, and the runtime would read that
// failure as "allow". A body that really is compressed is no JSON, and gets the
// deny. It returns the verdict too, or why the answer is no decision.
func (x *exchange) validatedAnswer(resp *bufferedResponse) (*http.Response, string, error) {
	body := resp.bodyBytes
	h := resp.Header
	for _, name := range []string{"Content-Encoding", "Content-Length", "Transfer-Encoding"} {
		inject.Remove(h, name)
	}
	if x.scrub.Active() {
		sc := &scrubber{set: x.scrub, x: x}
		sc.head(resp.Response)
		sc.add(x.scrub.Bytes(body))
	}
	verdict, err := hooks.Verdict(resp.StatusCode, body, x.snap.Limits.HookBodyBytes)
	if err != nil {
		return nil, "", err
	}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	return &http.Response{
		StatusCode: resp.StatusCode, Status: resp.Status, ProtoMajor: 1, ProtoMinor: 1, Header: h,
		ContentLength: int64(len(body)), Body: io.NopCloser(bytes.NewReader(body)),
	}, verdict, nil
}

// laneCut makes a cut of the lane connection (server.go) end the call: one already
// cut is refused at once, one cut meanwhile sees its context end. The function
// it returns stops watching for the cut.
func (x *exchange) laneCut(ctx context.Context, prepErr error) (context.Context, func(), error) {
	if x.cut == nil {
		return ctx, func() {}, prepErr
	}
	x.lane.inCall.Store(true)
	if x.cut.Err() != nil && prepErr == nil {
		prepErr = errLaneCut
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(x.cut, func() { cancel(errLaneCut) })
	return ctx, func() { stop(); cancel(nil) }, prepErr
}

// bufferedResponse is an upstream response whose body has been read.
type bufferedResponse struct {
	*http.Response
	bodyBytes []byte
}

// forwardHook prepares, signs and forwards the hook call and reads the answer.
func (x *exchange) forwardHook(ctx context.Context, m hooks.Match, prepErr error) (*bufferedResponse, error) {
	if prepErr != nil {
		return nil, prepErr
	}
	limit := x.snap.Limits.HookBodyBytes
	reqBuf := &hookBuffer{b: x.budget, client: hookClient(x.rec)}
	defer reqBuf.release()
	body, err := reqBuf.read(x.body, limit, x.req.ContentLength)
	if err != nil {
		if bodyErr := x.body.clientError(); bodyErr != nil {
			return nil, bodyErr
		}
		if rf := (*refusal)(nil); errors.As(err, &rf) {
			return nil, rf
		}
		return nil, badRequest("malformed_body", err)
	}
	if int64(len(body)) > limit {
		return nil, badRequest("hook_body_too_large", fmt.Errorf("hook request larger than %d bytes", limit))
	}
	out, err := x.prepare(ctx)
	if err != nil {
		return nil, err
	}
	out.Body, out.ContentLength = io.NopCloser(reqBuf.reader(body)), int64(len(body))
	out.TransferEncoding = nil
	if m.Event == hooks.EventPre {
		// The decision is checked and answered as bytes (validatedAnswer): ask
		// for them uncompressed.
		inject.Remove(out.Header, "Accept-Encoding")
		out.Header["Accept-Encoding"] = []string{"identity"}
	}
	assertion, err := x.snap.Hooks.Signer.SignSandboxCall(m, x.snap.Env, x.snap.Sandbox, x.ident, body)
	if err != nil {
		return nil, &hookError{"hook signing key unavailable", err}
	}
	out.Header.Set(hookauth.HeaderName, assertion)
	resp, err := x.roundTrip(out)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// The decision's buffer is released when the call returns, before the answer is
	// written: the endpoint, not the sandbox, chose its size.
	respBuf := &hookBuffer{b: x.budget, client: hookClient(x.rec)}
	defer respBuf.release()
	rbody, err := respBuf.read(resp.Body, limit, resp.ContentLength)
	rbody = bytes.Clone(rbody) // written to the client after the buffer is released
	if rf := (*refusal)(nil); errors.As(err, &rf) {
		return nil, rf
	}
	if err != nil {
		return nil, fmt.Errorf("reading the hook response: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(rbody))
	resp.ContentLength = int64(len(rbody))
	resp.Header.Set("Content-Length", strconv.Itoa(len(rbody)))
	resp.TransferEncoding = nil
	return &bufferedResponse{resp, rbody}, nil
}

// hookError is a hook failure egressd names itself.
type hookError struct {
	msg string
	err error
}

func (e *hookError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

// hookFailure words what failed, for the deny's reason. It names reason codes and
// the endpoint's status, never a secret or an upstream error's detail.
func hookFailure(err error) string {
	var he *hookError
	var de *hooks.DecisionError
	switch {
	case errors.As(err, &de):
		return de.Error()
	case errors.As(err, &he):
		return he.msg
	case errors.Is(err, context.DeadlineExceeded):
		return "endpoint timed out"
	}
	rf := classify(err)
	if rf.Reason == "upstream_timeout" {
		return "endpoint timed out"
	}
	return "request refused (" + string(rf.Reason) + ")"
}

// denyResponse is egressd's explicit deny in the endpoint's place.
func denyResponse(reason string) *http.Response {
	body := hooks.DenyBody(reason)
	return &http.Response{
		StatusCode: http.StatusOK, ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{
			"Content-Type":   {"application/json"},
			"Content-Length": {strconv.Itoa(len(body))},
			"Egressd-Hook":   {"fail-closed"},
		},
		ContentLength: int64(len(body)),
		Body:          io.NopCloser(bytes.NewReader(body)),
	}
}

// countHook counts the hook call's outcome, once its answer has been written:
// the label says what the runtime got, not what the endpoint sent.
func (x *exchange) countHook() {
	if x.hook != nil && x.hookOutcome != "" && x.metrics != nil {
		x.metrics.HookRequests.WithLabelValues(x.hook.Event, x.hookOutcome).Inc()
	}
}
