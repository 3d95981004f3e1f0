package placeholder

import (
	"io"

	"github.com/egressd/egressd/internal/scrub"
)

// Upgraded returns src, the client's side of a connection switched to another
// protocol (what it sends after the 101) toward host, read through the placeholders:
// the same bytes, ended with a *ScopeError where a placeholder appears, since no
// location of a switched connection can carry one. What came before the placeholder
// has been read; the placeholder itself never is.
//
// A WebSocket is read frame by frame, each payload unmasked with the client's key, by
// the scrub package's frame parser, over every form of every placeholder it knows
// (raw, base64, hex, percent, JSON escapes...): a placeholder split across the frames
// of a fragmented message is found when its last byte arrives, by which time at most
// the first scrub.MinLen-1 bytes of it have been read unmasked (longer beginnings are
// read masked). The error then names no credential: the frame parser counts
// occurrences, it does not name them. Any other protocol is read as a byte stream,
// raw placeholders only, as a body is.
func (r *Replacer) Upgraded(src io.Reader, host string, websocket bool) io.Reader {
	if !r.Active() {
		return src
	}
	if websocket {
		return &frames{r: r.phSet().WebSocket(src), host: host}
	}
	refuse := func(k int) verdict {
		return verdict{err: &ScopeError{ID: r.byPH[r.phs[k]], Host: host, Location: LocationUpgrade}}
	}
	b := newBodyStream(r.m, refuse, nil)
	b.src, b.closer = src, io.NopCloser(src)
	return b
}

// frames is a WebSocket client's stream, ended at the first placeholder.
type frames struct {
	r    *scrub.Reader
	host string
	err  error
}

// Read returns what the scrub Reader released, unless its scan has found a
// placeholder: the bytes of that scan, which hold it (masked), are never returned.
func (f *frames) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.r.Read(p)
	if f.r.Count() > 0 {
		f.err = &ScopeError{Host: f.host, Location: LocationWebSocket}
		return 0, f.err
	}
	return n, err
}
