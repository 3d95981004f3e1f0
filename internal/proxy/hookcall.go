package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
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
	// : config.IdentifyListener (only a hooks listener's traffic),
	// IdentifyRuntimeAuth (traffic that presents RuntimeToken) or IdentifyURL
	// (any traffic to a hook URL).
	Identify string
	// RuntimeToken returns hooks.runtime_auth's token; an error when it cannot
	// be had.
	RuntimeToken func() ([]byte, error)
}

// hookCallKey marks the context of a hook call's outbound request: its answer is
// read into the hook share , not held in an HTTP/2 window (server.go).
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
	deadline := x.began.Add(hooks.Deadline(m.Timeout))
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

// hookBudget bounds the bytes of every hook body egressd holds in memory at once,
// process-wide (limits.hook_buffer_bytes): requests, which egressd reads whole to
// sign them, and decisions, which it reads whole to check them. Each buffer is
// reserved before it is allocated, so many large or stalled hook bodies, on any
// number of connections and HTTP/2 streams, cost at most the budget. Past it a
// call fails with overloaded: the fail-closed deny for a pre-tool call, 503 for
// anything else.
//
// A body is reserved as its bytes arrive, not by the length it declares: a call
// that declares a megabyte and sends one byte holds one hookChunk, so forty such
// calls cannot take a 32 MiB budget from real calls. And one client (a source
// address on a listener) holds at most half of the budget: a client that sends
// the bytes to fill it still leaves a client of its own to the runtime, when the
// runtime has one (another address, or a hooks listener).
//
// A released buffer still counts (as garbage) until egressd has forced a garbage
// collection: otherwise the collector's pacing (the heap may grow to twice what is
// live before it runs) would let a stream of hook bodies cost twice the budget.
// A reservation that only garbage stands in the way of runs that collection first
// (one at a time); under an attack that is about one per budget's worth of bodies.
type hookBudget struct {
	limit   atomic.Int64
	used    atomic.Int64 // reserved by calls in progress
	garbage atomic.Int64 // released since the last forced collection
	gcMu    sync.Mutex
	gcGen   atomic.Int64 // collections so far
	// shares holds what each client has reserved (by hookClient).
	sharesMu sync.Mutex
	shares   map[string]int64
}

// detailHookBuffer is the log detail of a hook call refused for the budget.
const detailHookBuffer = "hook_buffer"

var errHookBuffer = errors.New("limits.hook_buffer_bytes reached: too many hook bodies buffered at once")

// reserve takes n bytes of the budget for client, or reports false when they do
// not fit in the budget or the client's share, collecting the garbage first when
// that would make them fit.
func (b *hookBudget) reserve(client string, n int64) bool {
	if !b.takeShare(client, n) {
		return false
	}
	if b.tryReserve(n) {
		return true
	}
	if b.used.Load()+n <= b.limit.Load() && b.garbage.Load() > 0 {
		b.collect()
		if b.tryReserve(n) {
			return true
		}
	}
	b.giveShare(client, n)
	return false
}

// takeShare takes n bytes of client's share: half the budget.
func (b *hookBudget) takeShare(client string, n int64) bool {
	b.sharesMu.Lock()
	defer b.sharesMu.Unlock()
	if b.shares[client]+n > b.limit.Load()/2 {
		return false
	}
	if b.shares == nil {
		b.shares = map[string]int64{}
	}
	b.shares[client] += n
	return true
}

func (b *hookBudget) giveShare(client string, n int64) {
	b.sharesMu.Lock()
	defer b.sharesMu.Unlock()
	if b.shares[client] -= n; b.shares[client] <= 0 {
		delete(b.shares, client)
	}
}

func (b *hookBudget) tryReserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+b.garbage.Load()+n > b.limit.Load() {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// collect frees the garbage released so far. A caller that waited for another's
// collection returns without starting one of its own: a hook call waits for at
// most one collection.
func (b *hookBudget) collect() {
	gen := b.gcGen.Load()
	b.gcMu.Lock()
	defer b.gcMu.Unlock()
	if b.gcGen.Load() != gen {
		return
	}
	g := b.garbage.Load()
	runtime.GC()
	b.garbage.Add(-g)
	b.gcGen.Add(1)
}

// release returns n bytes of client's reservation: as garbage, or straight to
// the kernel when unmapped.
func (b *hookBudget) release(client string, n int64, unmapped bool) {
	b.used.Add(-n)
	if !unmapped {
		b.garbage.Add(n)
	}
	b.giveShare(client, n)
}

// hookClient is a hook call's client for the budget's shares: its source
// address on its listener.
func hookClient(rec *Record) string {
	host, _, err := net.SplitHostPort(rec.Client)
	if err != nil {
		host = rec.Client
	}
	return rec.Listener + " " + host
}

// hookChunk is the first reservation for a body; it doubles as the body's bytes
// arrive, up to the declared length when there is one.
const hookChunk = 32 << 10

// hookBuffer is one hook body read into reserved memory. Release returns the
// reservation once the bytes are no longer needed.
//
// A buffer of mmapMin bytes or more is mapped from the kernel rather than taken
// from the Go heap, and unmapped on release: its memory leaves the process at
// once, and it never inflates the collector's heap goal (a heap holding a full
// budget of hook bodies may otherwise grow to twice that before it collects).
// Nothing may read it after release: the forwarded request body reads it through
// reader, which stops at release, and the decision is copied out.
type hookBuffer struct {
	b        *hookBudget
	client   string // hookClient
	reserved int64
	mu       sync.Mutex
	mapped   []byte // the current mapping, when the buffer is one
	freed    bool
}

// mmapMin is the smallest buffer mapped from the kernel; smaller ones (a real
// runtime's tool calls, about a kilobyte) come from the heap.
const mmapMin = 64 << 10

func (h *hookBuffer) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.freed = true
	if h.mapped != nil {
		unix.Munmap(h.mapped)
		h.give(int64(len(h.mapped)), true) // returned to the kernel: no garbage
		h.mapped = nil
	}
	h.give(h.reserved, false)
}

// give returns n bytes of h's reservation.
func (h *hookBuffer) give(n int64, unmapped bool) {
	h.b.release(h.client, n, unmapped)
	h.reserved -= n
}

// reader reads body, which h holds, until h is released.
func (h *hookBuffer) reader(body []byte) io.Reader {
	return &heldReader{h: h, r: bytes.NewReader(body)}
}

type heldReader struct {
	h *hookBuffer
	r *bytes.Reader
}

func (r *heldReader) Read(p []byte) (int, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.h.freed {
		return 0, errHookBufferReleased
	}
	return r.r.Read(p)
}

var errHookBufferReleased = errors.New("hook body read after the call ended")

// read reads r to its end, or to limit+1 bytes (the caller tells "too large" from
// the length), reserving every byte of capacity before allocating it. hint is the
// declared length, or -1: it caps the buffer's growth (a body of the declared
// length fits at once when its bytes have come), never its first reservation.
func (h *hookBuffer) read(r io.Reader, limit, hint int64) ([]byte, error) {
	most := limit + 1
	if hint >= 0 {
		most = min(most, hint+1) // +1: room to read the EOF, or one byte too many
	}
	buf, err := h.grow(nil, min(hookChunk, most))
	for err == nil {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return buf, nil
			}
			next := min(2*int64(cap(buf)), limit+1)
			if int64(cap(buf)) < most {
				next = min(next, most)
			}
			if buf, err = h.grow(buf, next); err != nil {
				break
			}
		}
		var n int
		n, err = r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
	}
	if err == io.EOF {
		return buf, nil
	}
	return buf, err
}

// grow returns buf with capacity size, reserved first. The buffer it replaces is
// released: unmapped, or counted as garbage until the next forced collection.
func (h *hookBuffer) grow(buf []byte, size int64) ([]byte, error) {
	if !h.b.reserve(h.client, size) {
		return buf, &refusal{Reason: allowlist.ReasonOverloaded, Detail: detailHookBuffer, Err: errHookBuffer}
	}
	h.reserved += size
	var grown, mapped []byte
	if size < mmapMin {
		grown = make([]byte, len(buf), size)
	} else {
		m, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			h.give(size, true)
			return buf, fmt.Errorf("mapping a hook body buffer: %w", err)
		}
		grown, mapped = m[:len(buf)], m
	}
	copy(grown, buf)
	switch {
	case h.mapped != nil:
		unix.Munmap(h.mapped)
		h.give(int64(len(h.mapped)), true)
	case cap(buf) > 0:
		h.give(int64(cap(buf)), false)
	}
	h.mapped = mapped
	return grown, nil
}

// The runtime treats a failed pre-tool call as "allow", and the sandbox can send
// anything a hook call looks like, so a request to a hook URL is a hook call only
// when egressd can tell it came from the runtime, as hooks.identify says
// (docs/hooks.md): it came in on a role: hooks listener the sandbox cannot reach,
// it (or its tunnel's CONNECT) presented the runtime's own token as
// Proxy-Authorization, or, chosen explicitly, by its URL alone. The assertion's
// ident claim says which applied.

// callIdent is the ident of a call to a hook URL on a listener of role, whose
// request or tunnel was identified as authIdent (authIdent); "" when it is not
// the runtime's call.
func (h *Hooks) callIdent(role, authIdent string) string {
	switch h.Identify {
	case config.IdentifyListener:
		if role == config.RoleHooks {
			return hookauth.IdentListener
		}
		return ""
	case config.IdentifyRuntimeAuth:
		return authIdent
	}
	return hookauth.IdentURL
}

// authIdent is what a request's (or a CONNECT's) Proxy-Authorization says under
// identify runtime_auth: hookauth.IdentRuntimeAuth when it carries the runtime's
// token, IdentURL when the token cannot be had (the call is then told by its URL,
// and failed closed, rather than forwarded as anyone's request), else "".
func (h *Hooks) authIdent(header http.Header) string {
	if h == nil || h.Identify != config.IdentifyRuntimeAuth || h.RuntimeToken == nil {
		return ""
	}
	token, err := h.RuntimeToken()
	switch {
	case err != nil:
		return hookauth.IdentURL
	case presents(header.Values("Proxy-Authorization"), token):
		return hookauth.IdentRuntimeAuth
	}
	return ""
}

// presents reports whether one of the Proxy-Authorization values carries token:
// "Bearer <token>", or Basic credentials whose password is the token (a proxy
// URL such as http://runtime:<token>@egressd:15003, which clients send as Basic).
func presents(values []string, token []byte) bool {
	ok := false
	for _, v := range values {
		scheme, cred, _ := strings.Cut(strings.TrimSpace(v), " ")
		cred = strings.TrimSpace(cred)
		switch {
		case strings.EqualFold(scheme, "Bearer"):
			ok = equalSecret([]byte(cred), token) || ok
		case strings.EqualFold(scheme, "Basic"):
			raw, err := base64.StdEncoding.DecodeString(cred)
			if _, pass, found := strings.Cut(string(raw), ":"); err == nil && found {
				ok = equalSecret([]byte(pass), token) || ok
			}
		}
	}
	return ok
}

// equalSecret compares in constant time; an empty token matches nothing.
func equalSecret(a, token []byte) bool {
	return len(token) > 0 && subtle.ConstantTimeCompare(a, token) == 1
}
