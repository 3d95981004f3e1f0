package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/placeholder"
)

// setMemory sizes the memory budget for snap (limits.memory; auto is resolved again,
// so a reload follows a changed cgroup limit) and divides it:
//   - hook bodies get a standing share, limits.hook_buffer_bytes, at most half the
//     budget (but one hook body always): set aside, so that no flood of heads or
//     HTTP/2 windows can take the memory a hook call's body needs;
//   - large request heads may take at most an eighth (8 MiB at the shipped
//     256 MiB limit: 128 heads of 64 KiB, a thousand of 5 KiB): honest heads
//     beyond the connection's 4 KiB buffer are rare, and each held connection
//     also costs its goroutine and buffers outside the budget, so heads held
//     open by the thousand must leave room for those;
//   - HTTP/2 receive windows take what is left.
func (s *Server) setMemory(snap *Snapshot) {
	limit, _ := membudget.Resolve(snap.Limits.Memory)
	s.mem.SetLimit(limit)
	share := membudget.HookShare(limit, snap.Limits.HookBufferBytes, snap.Limits.HookBodyBytes)
	s.mem.SetAside(membudget.HookBodies, share)
	s.hookBuf.limit.Store(share)
	s.mem.SetCap(membudget.Heads, limit/8)
	s.shareConns.SetLimit(int64(snap.Limits.MaxConnections))
	snap.mem = s.mem
}

// The upstream HTTP/2 Transport's receive windows: how much of an upstream's
// response it buffers before egressd has read it. Go's defaults (4 MiB a stream,
// 1 GiB a connection) let one client that reads nothing, with a few streams,
// make egressd buffer hundreds of MiB of an upstream's data; these bound one
// connection to about a megabyte. A stream still moves 256 KiB per round trip, a
// few MiB/s at ordinary latencies.
const (
	upstreamStreamWindow = 256 << 10
	upstreamConnWindow   = 1 << 20
)

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

// errH2Windows refuses a request or stream whose HTTP/2 window the budget cannot hold.
var errH2Windows = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.H2Windows.Detail(),
	Err: errors.New("limits.memory reached: too many HTTP/2 receive windows held at once")}

// holdUpstreamWindow reserves a stream's window for a request the upstream client
// sends on its HTTP/2 transport (upstream.Options.HoldWindow), until the response
// body ends. Hook calls reserve none: egressd reads their answers itself, from the
// hook share (hookbuf.go), so a flood of other holders cannot deny them.
func (snap *Snapshot) holdUpstreamWindow(ctx context.Context) (release func(), err error) {
	if isHookCall(ctx) {
		return nil, nil
	}
	if !snap.mem.Reserve(membudget.H2Windows, upstreamStreamWindow) {
		return nil, errH2Windows
	}
	mem := snap.mem
	return func() { mem.Release(membudget.H2Windows, upstreamStreamWindow) }, nil
}

// holdStreamWindow reserves what an intercepted HTTP/2 client may send on r's
// stream before egressd reads it: its body's declared length, at most the stream's
// window (h2StreamWindow); nothing for a stream without a body. A connection
// buffers at most its window (h2ConnWindow) over all its streams, so what the
// streams reserve bounds it, and idle connections cost the budget nothing. It
// reports false, reserving nothing, when the budget cannot hold it; release gives
// it back.
func holdStreamWindow(mem *membudget.Budget, r *http.Request) (release func(), ok bool) {
	n := int64(h2StreamWindow)
	if r.ContentLength >= 0 {
		n = min(n, r.ContentLength)
	}
	if !mem.Reserve(membudget.H2Windows, n) {
		return func() {}, false
	}
	return func() { mem.Release(membudget.H2Windows, n) }, true
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
