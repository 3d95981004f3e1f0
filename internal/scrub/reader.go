package scrub

import (
	"errors"
	"io"
)

// Reader is a streaming masker: it reads its source and returns the same
// bytes with every occurrence of the Set's patterns masked.
//
// A body Reader (Set.Reader) holds back only the bytes that could be the
// start of a match (the longest suffix of what it has read that is a proper
// prefix of a pattern), so a chunk that ends outside any possible match (an
// SSE event's "\n\n") is returned by the Read that received it, and memory
// stays bounded by the longest pattern plus one read, whatever the body size.
// At EOF the held bytes are released as they are (they matched nothing); on
// any other source error they are dropped (they may be most of a secret) and
// the error returned. A Reader belongs to one goroutine, like the body it
// reads.
type Reader struct {
	set  *Set
	src  io.Reader
	st   stream
	out  []byte // masked bytes ready for Read
	err  error  // returned once out is drained
	fill func() // produces out or err; nil: fillBody
	ctl  int    // occurrences masked outside st (WebSocket control frames)
	idle int    // consecutive source reads that returned nothing
	pace *pacer // set by Paced
}

// maxIdleReads bounds consecutive (0, nil) reads from a source before Read
// gives up with io.ErrNoProgress, as bufio does, rather than spin.
const maxIdleReads = 100

// Reader returns a Reader masking the body r. With an inactive Set it
// passes r's bytes through untouched.
func (s *Set) Reader(r io.Reader) *Reader {
	return &Reader{set: s, src: r, st: stream{set: s}}
}

// Count returns the number of occurrences replaced so far.
func (r *Reader) Count() int { return r.st.n + r.ctl }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if !r.set.Active() {
		return r.src.Read(p)
	}
	for {
		if len(r.out) > 0 {
			n := copy(p, r.out)
			r.out = r.out[n:]
			return n, nil
		}
		if r.err != nil {
			r.st.free()
			return 0, r.err
		}
		if len(p) == 0 {
			return 0, nil
		}
		if r.fill != nil {
			r.fill()
		} else {
			r.fillBody() // no method value: it would cost an allocation per Reader
		}
	}
}

// fillBody reads once from the source after the held bytes and scans.
func (r *Reader) fillBody() {
	n, err := r.src.Read(r.st.space())
	eof := errors.Is(err, io.EOF)
	how := holdBack
	if eof {
		how = final
	}
	r.out = r.st.scan(n, how)
	if err != nil && !eof {
		r.st.drop() // the held bytes may be most of a secret
	}
	r.err = err
	if n > 0 || err != nil {
		r.idle = 0
	} else {
		r.idleRead()
	}
}

// idleRead counts a source read that returned nothing, and gives up after
// maxIdleReads in a row.
func (r *Reader) idleRead() {
	if r.idle++; r.idle >= maxIdleReads {
		r.err = io.ErrNoProgress
	}
}
