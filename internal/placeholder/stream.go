package placeholder

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ErrSplit is a placeholder the body may carry whose first bytes had already been
// forwarded when the rest arrived (the client paused inside it for pauseRelease): it
// can no longer be replaced whole, so the request is aborted.
var ErrSplit = errors.New("a placeholder arrived split by a pause after its first bytes had been forwarded, so it cannot be replaced")

// errClosed ends a Read that was waiting when the body was closed.
var errClosed = errors.New("placeholder: read on a closed request body")

// How much of a streamed body is read at once: a stream starts small (most request
// bodies are) and doubles while reads fill its buffer.
const (
	minStreamBuf = 4 << 10
	maxStreamBuf = 32 << 10
)

// pauseRelease is how long a held beginning of Prefix waits for the source before it
// is released: a read boundary inside a burst comes back far sooner, while a stream
// that merely ends a message on "e" or "egr" must not wait for the next message. A
// variable only so that tests whose sources never pause can rule a release out (a
// loaded machine may take longer than this to schedule a read).
var pauseRelease = 20 * time.Millisecond

// maxIdleReads bounds consecutive (0, nil) reads from a source before Read gives up
// with io.ErrNoProgress, as bufio does, rather than spin.
const maxIdleReads = 100

// verdict is what a placeholder becomes in this body: its value, escaped for the
// body's content type, or the error that refuses the request. Verdicts are settled
// when the request is prepared, so a body that streams for hours keeps the value it
// started with, and the response is scrubbed of exactly that.
type verdict struct {
	inserted string // the value as it goes into the body
	value    string // for the response's scrubbing
	err      error
}

// newBodyStream returns the search of a body, or of a switched connection's stream,
// over m's placeholders.
func newBodyStream(m *matcher, judge func(k int) verdict, trailer func() error) *bodyStream {
	return &bodyStream{m: m, judge: judge, trailer: trailer, verdict: make([]verdict, len(m.phs)),
		judged: make([]bool, len(m.phs)), used: make([]bool, len(m.phs)), closed: make(chan struct{})}
}

// bodyStream is a request body read through the placeholders' scope. A placeholder
// the body may carry is replaced by its verdict's value; any other ends the body
// with its verdict's error (a *ScopeError, ErrPlaintext, an unavailable credential),
// as does one in the trailers, checked when the body ends.
//
// It streams: each read's bytes are released except the longest suffix that may
// begin a placeholder (at most the longest placeholder less one byte), so memory is
// one buffer (at most 32 KiB and a placeholder) whatever the body's length, and a placeholder the body may not carry
// never leaves: the read that completes it ends the body instead. A held suffix that
// is only a beginning of Prefix ("e" to "egressd_ph") is released, and kept to
// search, once the source has paused for pauseRelease; one that holds all of Prefix
// waits for the next bytes. A placeholder that began in released bytes is refused
// when it completes, or, when the body may carry it, ends the body with ErrSplit.
type bodyStream struct {
	src     io.Reader
	closer  io.Closer
	m       *matcher
	judge   func(k int) verdict // the verdict of m.phs[k]
	verdict []verdict           // by index in m.phs, once judged
	judged  []bool
	trailer func() error // checks the trailers once the body has ended; nil: none
	buf     []byte
	full    bool            // the last read filled buf: the next one gets a larger buf
	end     int             // bytes in buf
	keep    int             // the held suffix buf[end-keep:end], searched again with the next bytes
	sent    int             // its first bytes, released on a pause
	ready   []byte          // released bytes not yet read
	out     []byte          // scratch for a scan that replaced
	err     error           // returned once ready is drained
	idle    int             // consecutive source reads that returned nothing
	pending bool            // a source read is in flight (a pause released the held bytes)
	results chan readResult // of the source reads made in a goroutine, one at a time
	timer   *time.Timer     // the pause of the last goroutine read
	closed  chan struct{}   // closed by Close: a Read waiting for a result gives up
	close   sync.Once
	used    []bool // by index in m.phs: replaced at least once
	refusal atomic.Pointer[error]
}

type readResult struct {
	n   int
	err error
}

// Read implements io.Reader.
func (b *bodyStream) Read(p []byte) (int, error) {
	for len(b.ready) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		b.fill()
	}
	n := copy(p, b.ready)
	b.ready = b.ready[n:]
	return n, nil
}

// Close closes the source. A Read waiting for a pending source read returns (a
// transport closes the body to stop its writer); the source read ends on its own,
// and is discarded.
func (b *bodyStream) Close() error {
	b.close.Do(func() { close(b.closed) })
	return b.closer.Close()
}

// refused returns the error a placeholder (or the trailers) ended the body with.
func (b *bodyStream) refused() error {
	if e := b.refusal.Load(); e != nil {
		return *e
	}
	return nil
}

// fill reads once after the held suffix and scans, or releases the held beginning of
// Prefix when the source pauses.
func (b *bodyStream) fill() {
	if !b.pending { // else a read is filling buf[end:]: the held suffix stays put
		b.grow()
	}
	r, ok := b.read()
	if !ok {
		b.ready, b.sent = b.buf[b.sent:b.end], b.keep
		return
	}
	b.scan(r.n, r.err)
}

// grow moves the held suffix to the start of buf, into a new one twice as large when
// the last read filled it.
func (b *bodyStream) grow() {
	held := b.buf[b.end-b.keep : b.end]
	switch {
	case b.buf == nil:
		b.buf = make([]byte, minStreamBuf+b.m.maxLen)
	case b.full && len(b.buf) < maxStreamBuf+b.m.maxLen:
		b.buf = make([]byte, min(2*(len(b.buf)-b.m.maxLen), maxStreamBuf)+b.m.maxLen)
	}
	b.end = copy(b.buf, held)
}

// read reads from the source into buf[end:]. While a releasable beginning of Prefix
// is held it reads in a goroutine and gives up after pauseRelease (ok false), leaving
// the read pending for the next fill.
func (b *bodyStream) read() (r readResult, ok bool) {
	if !b.pending && !b.pausable() {
		n, err := b.src.Read(b.buf[b.end:])
		return readResult{n, err}, true
	}
	if !b.pending {
		if b.results == nil {
			b.results = make(chan readResult, 1)
		}
		b.pending = true
		go func(src io.Reader, p []byte, done chan<- readResult) {
			n, err := src.Read(p)
			done <- readResult{n, err}
		}(b.src, b.buf[b.end:], b.results)
	}
	var pause <-chan time.Time
	if b.pausable() {
		if b.timer == nil {
			b.timer = time.NewTimer(pauseRelease)
		} else {
			b.timer.Reset(pauseRelease)
		}
		defer b.timer.Stop()
		pause = b.timer.C
	}
	select {
	case r = <-b.results:
		b.pending = false
		return r, true
	case <-pause:
		return r, false
	case <-b.closed:
		return readResult{err: errClosed}, true
	}
}

// pausable reports whether unreleased held bytes are only a beginning of Prefix.
func (b *bodyStream) pausable() bool { return b.sent < b.keep && b.keep < len(Prefix) }

// scan takes n new bytes at buf[end:] and the source's error, and releases what it can.
func (b *bodyStream) scan(n int, err error) {
	b.full = n == len(b.buf)-b.end
	b.end += n
	eof := errors.Is(err, io.EOF)
	if eof && b.trailer != nil {
		if terr := b.trailer(); terr != nil {
			b.refuse(terr)
			return
		}
	}
	if err != nil && !eof {
		b.err = err // the held bytes are dropped: they may begin a placeholder
		return
	}
	if n == 0 && !eof {
		if b.idle++; b.idle >= maxIdleReads {
			b.err = io.ErrNoProgress
		}
		return
	}
	b.idle = 0
	win := b.buf[:b.end]
	out, last, rerr := b.replace(win, b.sent, b.out[:0])
	if rerr != nil {
		b.refuse(rerr)
		return
	}
	hold := 0
	if !eof {
		hold = b.m.hold(win[last:])
	}
	from := b.end - hold
	if last == 0 {
		b.ready = win[b.sent:max(from, b.sent)]
	} else {
		b.out = append(out, win[last:from]...)
		b.ready = b.out
	}
	b.keep, b.sent = hold, max(0, b.sent-from)
	if eof {
		b.err = io.EOF
	}
}

// replace appends win[pos:] up to the end of its last placeholder to out, each
// placeholder replaced by its verdict's value, and returns out and that end (0 without
// a placeholder), or the error that refuses the body. A placeholder that begins
// before pos began in bytes already released.
func (b *bodyStream) replace(win []byte, pos int, out []byte) ([]byte, int, error) {
	last := 0
	for at, k := b.m.next(win, 0); at >= 0; at, k = b.m.next(win, last) {
		v := b.verdictOf(k)
		switch {
		case v.err != nil:
			return nil, 0, v.err
		case at < pos:
			return nil, 0, ErrSplit
		}
		out = append(append(out, win[pos:at]...), v.inserted...)
		b.used[k] = true
		pos, last = at+len(b.m.phs[k]), at+len(b.m.phs[k])
	}
	return out, last, nil
}

// verdictOf returns the verdict of m.phs[k], judged on first need.
func (b *bodyStream) verdictOf(k int) verdict {
	if !b.judged[k] {
		b.verdict[k], b.judged[k] = b.judge(k), true
	}
	return b.verdict[k]
}

// all replaces in a whole body (ended cleanly when complete), and checks the trailers
// of a complete one.
func (b *bodyStream) all(body []byte, complete bool) ([]byte, error) {
	out, last, err := b.replace(body, 0, nil)
	if err == nil && complete && b.trailer != nil {
		err = b.trailer()
	}
	if err != nil || last == 0 {
		return body, err
	}
	return append(out, body[last:]...), nil
}

// refuse ends the body with err, releasing nothing more, and records it for the proxy.
func (b *bodyStream) refuse(err error) {
	b.err, b.ready = err, nil
	b.refusal.Store(&err)
}
