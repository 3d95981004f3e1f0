package scrub

import (
	"errors"
	"io"
	"time"
)

// Paced makes r, a body Reader, release the bytes it holds back once its source
// has paused for pause with bytes held: they go out masked when they are at least
// MinLen bytes of a form, as they are otherwise, and stay as context, so the rest of
// an occurrence that arrives later is still masked. A streamed event or gRPC message
// whose last bytes could begin a secret so reaches the client within pause of the
// upstream's flush instead of waiting for its next write. The source is read on a
// goroutine of r's own, one read at a time, into a buffer of its own; closing the
// source ends it. Call Paced before the first Read.
func (r *Reader) Paced(pause time.Duration) *Reader {
	if !r.set.Active() {
		return r
	}
	r.pace = &pacer{pause: pause, ch: make(chan chunk, 1), timer: time.NewTimer(pause), rbuf: make([]byte, minRead)}
	r.pace.timer.Stop()
	r.fill = r.fillPaced
	return r
}

// pacer is a Paced Reader's state: the read under way and what it returned.
type pacer struct {
	pause   time.Duration
	ch      chan chunk // the running read's result
	reading bool
	timer   *time.Timer
	rbuf    []byte // what the reads read into; one read at a time
	buf     []byte // the last chunk's bytes not yet scanned
	err     error  // the last chunk's error, once buf is scanned
	done    bool   // err has been taken
}

type chunk struct {
	b   []byte
	err error
}

// fillPaced scans the next bytes from the source, or, when it pauses with bytes
// held, releases them.
func (r *Reader) fillPaced() {
	p := r.pace
	if len(p.buf) == 0 && !p.done && p.err == nil {
		if !r.await() {
			r.st.space()
			r.out = r.st.scan(0, flushAll) // the source paused: release what is held
			return
		}
	}
	n := copy(r.st.space(), p.buf)
	p.buf = p.buf[n:]
	if n > 0 {
		r.idle = 0
	}
	how := holdBack
	last := len(p.buf) == 0 && p.err != nil
	eof := last && errors.Is(p.err, io.EOF)
	if eof {
		how = final
	}
	r.out = r.st.scan(n, how)
	if last {
		if !eof {
			r.st.drop() // the held bytes may be most of a secret
		}
		r.err, p.done = p.err, true
	}
}

// await waits for the running read (starting one if none runs) and takes its
// result; it reports false when bytes are held and the source stays quiet for the
// pause first (the read keeps running).
func (r *Reader) await() bool {
	p := r.pace
	if !p.reading {
		p.reading = true
		go func(src io.Reader, b []byte) {
			n, err := src.Read(b)
			p.ch <- chunk{b[:n], err}
		}(r.src, p.rbuf)
	}
	var c chunk
	if r.st.keep > r.st.sent { // bytes held that the client has not seen
		p.timer.Reset(p.pause)
		select {
		case c = <-p.ch:
			p.timer.Stop()
		case <-p.timer.C:
			return false
		}
	} else {
		c = <-p.ch
	}
	p.reading = false
	p.buf, p.err = c.b, c.err
	if len(c.b) == 0 && c.err == nil {
		r.idleRead()
	}
	return true
}
