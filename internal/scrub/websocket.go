package scrub

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"slices"
)

// Errors of a WebSocket Reader. The proxy ends the connection on any of
// them: what follows cannot be scrubbed.
var (
	// ErrWebSocketExtension: a frame with RSV1-3 set, i.e. an extension such
	// as permessage-deflate (RFC 7692) is in use. A compressed message cannot
	// be scrubbed frame by frame, so the proxy must remove
	// Sec-WebSocket-Extensions from the client's upgrade request on every
	// upgrade it injected into (the server then cannot negotiate one); a
	// server that sets RSV bits anyway gets this error, never a pass.
	ErrWebSocketExtension = errors.New("scrub: websocket frame uses an extension (RSV bit set)")
	// ErrWebSocketFrame: a frame RFC 6455 forbids (unknown opcode, a
	// continuation outside a message, a control frame fragmented or longer
	// than 125 bytes, a 64-bit length with the top bit set).
	ErrWebSocketFrame = errors.New("scrub: malformed websocket frame")
)

// RFC 6455 section 5.2 frame bits and opcodes.
const (
	wsFin          = 0x80
	wsRSV          = 0x70
	wsOpcode       = 0x0f
	wsMask         = 0x80
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsMaxControl   = 125
)

// WebSocket returns a Reader over the server-to-client byte stream of an
// upgraded connection (everything after the 101 response): the same frames,
// same headers and lengths, with each data payload masked in place.
//
// What is guaranteed:
//   - Text and binary messages, masked or unmasked frames (a masked frame is
//     unmasked to scan, then masked again with its own key), 7-, 16- and
//     64-bit lengths. A frame's header is released when it arrives and its
//     payload as it arrives, holding back only a possible match start, and
//     never past the frame's end: no frame waits for the next.
//   - Inside one frame every occurrence is masked, as in a body.
//   - In a fragmented message the frames are scanned as one stream, so an
//     occurrence split across continuation frames is still found: its bytes
//     in the later frames are masked. Its bytes at the end of the earlier
//     frame left before the rest arrived: when they are MinLen bytes or more
//     that begin a form of a secret they were masked anyway (speculatively);
//     so at most MinLen-1 bytes of an occurrence, all at the end of a frame
//     whose message continues, ever reach the client unmasked.
//   - Control frames (close, ping, pong) keep their place and length and
//     never break a message's state; their payload (a close reason can quote
//     a request) is masked on its own.
//   - Frames with RSV bits (permessage-deflate) end the stream with
//     ErrWebSocketExtension, malformed frames with ErrWebSocketFrame.
func (s *Set) WebSocket(r io.Reader) *Reader {
	rd := &Reader{set: s, src: r, st: stream{set: s}}
	ws := &wsReader{rd: rd, br: bufio.NewReaderSize(r, maxRead)}
	rd.fill = ws.fill
	return rd
}

// wsReader walks the frames for a WebSocket Reader.
type wsReader struct {
	rd     *Reader
	br     *bufio.Reader
	hdr    [14]byte
	out    []byte // scratch for headers and control frames
	left   uint64 // payload bytes of the current data frame not yet read
	inMsg  bool   // inside a fragmented message (a data frame without FIN)
	fin    bool   // the current data frame ends its message
	masked bool
	key    [4]byte
	recv   uint64 // payload bytes of the current frame read
	sent   uint64 // payload bytes of the current frame released
	inData bool   // a data frame's payload is being read
}

// fill produces the next header, payload piece or control frame.
func (w *wsReader) fill() {
	var err error
	if w.inData {
		err = w.payload()
	} else {
		err = w.frame()
	}
	if err != nil {
		w.rd.err = err
	}
}

// frame reads one frame header; a data frame's header is released at once,
// a control frame whole.
func (w *wsReader) frame() error {
	h, err := w.header()
	if err != nil {
		return err
	}
	op := h[0] & wsOpcode
	if op >= 0x8 {
		return w.control(h)
	}
	switch {
	case op == wsContinuation && !w.inMsg, (op == wsText || op == wsBinary) && w.inMsg, op > wsBinary:
		return ErrWebSocketFrame
	case op != wsContinuation:
		w.rd.st.drop() // a new message: no context from the last one
	}
	w.fin = h[0]&wsFin != 0
	w.inMsg = !w.fin
	w.inData, w.recv, w.sent = true, 0, 0
	w.rd.out = h
	if w.left == 0 { // an empty frame: only the message state moves on
		w.rd.st.space()
		w.rd.st.scan(0, w.end())
		w.inData = false
	}
	return nil
}

// end is how the last scan of the current frame releases: everything, and
// keeping context only when the message continues.
func (w *wsReader) end() release {
	if w.fin {
		return final
	}
	return flushAll
}

// header reads a frame header into w.hdr and sets left, masked and key.
// EOF before a frame is the clean end of the stream.
func (w *wsReader) header() ([]byte, error) {
	h := w.hdr[:2]
	if err := w.readFull(h); err != nil {
		if errors.Is(err, io.EOF) && !w.inMsg {
			return nil, io.EOF
		}
		return nil, unexpected(err)
	}
	if h[0]&wsRSV != 0 {
		return nil, ErrWebSocketExtension
	}
	ext := 0
	switch h[1] & 0x7f {
	case 126:
		ext = 2
	case 127:
		ext = 8
	}
	w.masked = h[1]&wsMask != 0
	n := 2 + ext
	if w.masked {
		n += 4
	}
	h = w.hdr[:n]
	if err := w.readFull(h[2:]); err != nil {
		return nil, unexpected(err)
	}
	switch ext {
	case 0:
		w.left = uint64(h[1] & 0x7f)
	case 2:
		w.left = uint64(binary.BigEndian.Uint16(h[2:4]))
	default:
		w.left = binary.BigEndian.Uint64(h[2:10])
		if w.left>>63 != 0 {
			return nil, ErrWebSocketFrame
		}
	}
	if w.masked {
		copy(w.key[:], h[n-4:])
	}
	return h, nil
}

// control reads a whole control frame (at most 125 bytes), masks its
// payload on its own and releases it.
func (w *wsReader) control(h []byte) error {
	if h[0]&wsFin == 0 || w.left > wsMaxControl || h[0]&wsOpcode > 0xa {
		return ErrWebSocketFrame
	}
	need := len(h) + int(w.left)
	w.out = slices.Grow(w.out[:0], need)[:need]
	copy(w.out, h)
	p := w.out[len(h):]
	if err := w.readFull(p); err != nil {
		return unexpected(err)
	}
	w.xor(p, 0)
	w.rd.ctl += w.rd.set.Bytes(p)
	w.xor(p, 0)
	w.rd.out = w.out
	w.left = 0
	return nil
}

// payload reads what is there of the current data frame (one read) and
// releases it masked.
func (w *wsReader) payload() error {
	space := w.rd.st.space()
	if uint64(len(space)) > w.left {
		space = space[:w.left]
	}
	n, err := w.br.Read(space)
	if n == 0 && err == nil {
		if w.rd.idle++; w.rd.idle >= maxIdleReads {
			return io.ErrNoProgress
		}
	} else {
		w.rd.idle = 0
	}
	w.xor(space[:n], w.recv)
	w.recv += uint64(n)
	w.left -= uint64(n)
	how := holdBack
	if w.left == 0 {
		how, w.inData = w.end(), false
	}
	w.release(w.rd.st.scan(n, how))
	if err != nil && w.left > 0 {
		w.rd.st.drop() // the held bytes may be most of a secret
		return unexpected(err)
	}
	return nil
}

// readFull fills p from the buffered source. Unlike io.ReadFull over
// bufio.Reader.Read, Peek gives up with io.ErrNoProgress on a source that
// keeps returning nothing. A clean end before the first byte is io.EOF.
func (w *wsReader) readFull(p []byte) error {
	b, err := w.br.Peek(len(p))
	copy(p, b)
	_, _ = w.br.Discard(len(b))
	if errors.Is(err, io.EOF) && len(b) > 0 {
		return io.ErrUnexpectedEOF
	}
	return err
}

// unexpected is a source error inside a frame: EOF there is
// io.ErrUnexpectedEOF; other errors (a reset, io.ErrNoProgress) pass.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// release queues payload bytes, masked again with the frame's key.
func (w *wsReader) release(p []byte) {
	w.xor(p, w.sent)
	w.sent += uint64(len(p))
	w.rd.out = p
}

// xor applies the frame's masking key to p, which starts at payload offset
// off (RFC 6455 section 5.3); a no-op for unmasked frames.
func (w *wsReader) xor(p []byte, off uint64) {
	if !w.masked {
		return
	}
	for i := range p {
		p[i] ^= w.key[(off+uint64(i))&3]
	}
}
