package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/membudget"
)

// setMemory sizes the memory budget for rt (limits.memory; auto is resolved again,
// so a reload follows a changed cgroup limit) and divides it:
//   - hook bodies get a standing share, limits.hook_buffer_bytes, at most half the
//     budget (but one hook body always): set aside, so that no flood of heads or
//     HTTP/2 windows can take the memory a hook call's body needs;
//   - large request heads may take at most a quarter: honest heads beyond the
//     connection's 4 KiB buffer are rare, and each held connection also costs its
//     goroutine and buffers outside the budget, so heads held open by the
//     thousand must leave room for those;
//   - HTTP/2 receive windows take what is left.
func (s *Server) setMemory(rt *Runtime) {
	limit, _ := membudget.Resolve(rt.Limits.Memory)
	s.mem.SetLimit(limit)
	share := membudget.HookShare(limit, rt.Limits.HookBufferBytes, rt.Limits.HookBodyBytes)
	s.mem.SetAside(membudget.HookBodies, share)
	s.hookBuf.limit.Store(share)
	s.mem.SetCap(membudget.Heads, limit/4)
	rt.mem = s.mem
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

// errH2Windows refuses a request or stream whose HTTP/2 window the budget cannot hold.
var errH2Windows = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.H2Windows.Detail(),
	Err: errors.New("limits.memory reached: too many HTTP/2 receive windows held at once")}

// windowHold is one upstream HTTP/2 stream's window, reserved while its response
// body is open: what the Transport may buffer for it.
type windowHold struct {
	mem  *membudget.Budget
	once sync.Once
}

// holdUpstreamWindow reserves a stream's window for a request sent on tr when tr
// may speak HTTP/2. Hook calls reserve none: egressd reads their answers itself,
// from the hook share (hookbuf.go), so a flood of other holders cannot deny them.
func (rt *Runtime) holdUpstreamWindow(tr *http.Transport, rec *Record) (*windowHold, error) {
	if tr != rt.transport || rec.HookEvent != "" {
		return nil, nil
	}
	if !rt.mem.Reserve(membudget.H2Windows, upstreamStreamWindow) {
		return nil, errH2Windows
	}
	return &windowHold{mem: rt.mem}, nil
}

// keep ties the window to resp's body, or releases it when there is none to
// buffer: a failed round trip, an HTTP/1.1 answer, a protocol switch.
func (h *windowHold) keep(resp *http.Response, err error) (*http.Response, error) {
	if h == nil {
		return resp, err
	}
	if err != nil || resp.ProtoMajor != 2 || resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == http.NoBody {
		h.release()
		return resp, err
	}
	resp.Body = &heldBody{ReadCloser: resp.Body, h: h}
	return resp, nil
}

func (h *windowHold) release() {
	h.once.Do(func() { h.mem.Release(membudget.H2Windows, upstreamStreamWindow) })
}

// heldBody releases its window when the body ends or is closed, whichever is first.
type heldBody struct {
	io.ReadCloser
	h *windowHold
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.h.release()
	}
	return n, err
}

func (b *heldBody) Close() error {
	err := b.ReadCloser.Close()
	b.h.release()
	return err
}

// clientWindows are the connection windows an intercepted HTTP/2 client is offered,
// largest first: under memory pressure a new connection gets a smaller window (less
// throughput, the same answers) before it gets none. The smallest is the protocol's
// initial window, which a client may fill before any setting of egressd's arrives.
var clientWindows = []int64{h2ConnWindow, h2ConnWindow / 4, h2MinConnWindow}

// h2MinConnWindow is RFC 9113's initial window (65,535 bytes), rounded up.
const h2MinConnWindow = 64 << 10

// holdClientWindow reserves the receive window of an intercepted HTTP/2
// connection: the request bodies its client may send before egressd reads them.
// It returns the window, or 0 when not even the smallest fits: the connection's
// streams are then refused (overloaded, memory_h2_windows) and it buffers nothing.
func holdClientWindow(mem *membudget.Budget) int64 {
	for _, n := range clientWindows {
		if mem.Reserve(membudget.H2Windows, n) {
			return n
		}
	}
	return 0
}
