package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/scrub"
)

// Nothing injected comes back (docs/policy.md): every response egressd sees is masked
// by value, not by request, of every value the sandbox can make egressd place (each
// environment_variable credential's) and every value the winning entry injects,
// whether or not this request carried a placeholder or was injected into: an upstream
// can store what one request sent and serve it to another. It is masked before the
// sandbox reads any of it: status text, every header, the body as it streams (decoded
// first when the upstream compressed it, a compressed container decoded and compressed
// again), the trailers, and the upstream's WebSocket frames. A response with nothing to
// mask it of is not touched at all.

// scrubFor sets what the exchange's response is masked of: the Set of every
// environment_variable value (compiled once per value change, placeholder.Replacer.Scrub)
// joined with res's (the entry's injected values, compiled once per value change by the
// Injector). When that is anything, out is narrowed (narrowForScrub), and the byte
// range the client asked for is egressd's to serve .
func (x *exchange) scrubFor(out *http.Request, res inject.Result) {
	x.scrub = scrub.Join(x.snap.Placeholders.Scrub(), res.Scrub)
	x.rec.mask = x.scrub
	if x.scrub.Active() {
		x.wanted = wantedRange(out)
		narrowForScrub(out.Header)
	}
}

// narrowForScrub adjusts a request whose response is scrubbed so that the response
// stays scrubbable: a client's Accept-Encoding becomes identity, a WebSocket upgrade
// offers no extensions (permessage-deflate would compress the frames out of the
// scrubber's sight), and Range, Request-Range and If-Range go: a part of a body can start or end
// inside a value, where no form is found, and an upstream that reflects what it was
// sent could hand a value back a piece at a time. The whole body is asked for and
// masked, and egressd cuts the client's range from it ; a partial answer
// is refused (see partial). An absent Accept-Encoding stays absent: egressd adds no
// header.
//
// Identity rather than the codings the scrubber can decode: masking an identity body
// is many times faster than decoding and masking gzip or br (BenchmarkReader and
// BenchmarkDecodeReader in internal/scrub measure it), and re-encoding would cost
// more again (an encoder is slower than its decoder) for the loopback or veth leg to
// the sandbox, where size is free. The leg identity makes larger is egressd's to the
// upstream. An upstream that compresses regardless is decoded and delivered as
// identity (scrubBody).
func narrowForScrub(h http.Header) {
	accepts := false
	for k, v := range h { // one pass, whatever the keys' case: this runs on every scrubbed request
		switch {
		case strings.EqualFold(k, "Accept-Encoding"):
			accepts = accepts || len(v) > 0
			delete(h, k)
		case strings.EqualFold(k, "Sec-WebSocket-Extensions"), strings.EqualFold(k, "Range"), strings.EqualFold(k, "If-Range"),
			strings.EqualFold(k, "Request-Range"): // Range's pre-standard name, which some servers still honour
			delete(h, k)
		}
	}
	if accepts {
		h["Accept-Encoding"] = []string{"identity"}
	}
}

// fieldValue returns the values of name in h, whatever the keys' case, joined by
// commas; a single value without allocating (this runs on every scrubbed response).
func fieldValue(h http.Header, name string) string {
	out := ""
	for k, vs := range h {
		if !strings.EqualFold(k, name) {
			continue
		}
		for _, v := range vs {
			if out != "" {
				out += ","
			}
			out += v
		}
	}
	return out
}

// headerValues returns the values of name in h, whatever the keys' case.
func headerValues(h http.Header, name string) []string {
	var out []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return out
}

// scrubber masks one response and keeps its count on the Record.
type scrubber struct {
	set   *scrub.Set
	x     *exchange
	fixed int           // replacements in the head and the trailers
	body  *scrub.Reader // the body's (or switched connection's) masker, once there is one
	rb    scrubbedBody  // the body scrubBody hands out (allocated with the scrubber)
}

// scrubbed returns resp masked for the client when there is anything to mask it of,
// resp itself otherwise. A body the scrubber cannot see through (a content coding
// or compressed container it does not decode, an upgrade that negotiated frame
// compression, a part of a body) is never delivered: the client gets the refusal
// instead.
func (x *exchange) scrubbed(resp *http.Response) *http.Response {
	if !x.scrub.Active() {
		return resp
	}
	sc := &scrubber{set: x.scrub, x: x}
	sc.head(resp)
	var err error
	switch {
	case partial(resp):
		err = &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: "partial_content", Err: errPartial}
	case resp.StatusCode == http.StatusSwitchingProtocols:
		err = sc.upgrade(resp)
	case bodyless(x.req.Method, resp.StatusCode):
	default:
		err = sc.scrubBody(resp)
	}
	if err != nil {
		resp.Body.Close()
		return refusedResponse(x.snap, x.rec, err)
	}
	x.serveRange(resp)
	return resp
}

// head masks the status text, every header field, names included, and the names
// of the trailers the upstream declared: an HTTP/1.1 client is told them in a
// Trailer field (writeResponse) before the trailers themselves are masked.
func (sc *scrubber) head(resp *http.Response) {
	var n int
	resp.Status, n = sc.set.String(resp.Status)
	sc.add(n + sc.fields(resp.Header) + sc.fields(resp.Trailer))
}

// fields masks h's names and values in place and returns the replacements.
func (sc *scrubber) fields(h http.Header) int {
	total := 0
	var renamed http.Header
	for k, values := range h {
		for i, v := range values {
			var n int
			values[i], n = sc.set.String(v)
			total += n
		}
		if name, n := sc.name(k); n > 0 {
			total += n
			delete(h, k)
			if renamed == nil {
				renamed = http.Header{}
			}
			renamed[name] = append(renamed[name], values...)
		}
	}
	for k, v := range renamed {
		h[k] = append(h[k], v...)
	}
	return total
}

// name masks a field name. Names are case-insensitive and get re-cased on the way
// (canonical on HTTP/1.1, lower-case on HTTP/2), so a value is looked for in the
// name as received and lower-cased.
func (sc *scrubber) name(k string) (string, int) {
	var buf [2][64]byte // names are short: masked on the stack, allocated only when they match
	raw := append(buf[0][:0], k...)
	lower := append(buf[1][:0], k...)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	n, m := sc.set.Bytes(raw), sc.set.Bytes(lower)
	if n == 0 && m == 0 {
		return k, 0
	}
	for i := range raw {
		if lower[i] == scrub.Mask {
			raw[i] = scrub.Mask
		}
	}
	return string(raw), max(n, m)
}

// add records n more replacements, and warns the first time a (rule, credential)
// is seen reflected.
func (sc *scrubber) add(n int) {
	sc.fixed += n
	sc.update()
}

func (sc *scrubber) update() {
	rec := sc.x.rec
	was := rec.Scrubbed
	rec.Scrubbed = sc.fixed
	if sc.body != nil {
		rec.Scrubbed += sc.body.Count()
	}
	if was == 0 && rec.Scrubbed > 0 && sc.x.srv != nil {
		sc.x.srv.warnReflected(rec)
	}
}

// warnReflected logs, once per (rule, credential), that an upstream sent back a
// value egressd injected. It names the rule and credential ID, never the value.
func (s *Server) warnReflected(rec *Record) {
	if _, seen := s.reflected.LoadOrStore(rec.Rule+"\x00"+rec.Credential, true); seen {
		return
	}
	s.log.Warn().Str("rule", rec.Rule).Str("credential", rec.Credential).Str("host", rec.Host).
		Str("req_id", rec.ReqID).Msg("an upstream reflected a value egressd injected; it was masked " +
		"in the response (logged once per rule and credential)")
}

// partial reports whether resp is a part of a body: 206, or a multipart/byteranges
// body under another status. The request asked for no range (narrowForScrub), so
// this is the upstream's doing, and a part may cut a value where no form is found.
func partial(resp *http.Response) bool {
	if resp.StatusCode == http.StatusPartialContent {
		return true
	}
	for k, vs := range resp.Header {
		if !strings.EqualFold(k, "Content-Type") {
			continue
		}
		for _, ct := range vs {
			if mt, _, _ := strings.Cut(ct, ";"); strings.EqualFold(strings.TrimSpace(mt), "multipart/byteranges") {
				return true
			}
		}
	}
	return false
}

// Causes of the refusals scrubBody and scrubbed return, logged only.
var (
	errUndecodable = errors.New("the upstream's content-encoding cannot be scrubbed")
	errContainer   = errors.New("the upstream's compressed container cannot be scrubbed")
	errPartial     = errors.New("the upstream answered a part of the body, which cannot be scrubbed")
)

// scrubPause is how long a streamed body may pause with bytes held back (they might
// begin a secret) before they are released: masked when they are at least MinLen
// bytes of a form, so an SSE event or a gRPC message reaches the client at once.
const scrubPause = 20 * time.Millisecond

// scrubBody masks the body as it streams, decoding it first when the upstream
// compressed it (it is then delivered as identity: Content-Encoding and
// Content-Length go, and the writers re-frame it, chunked on HTTP/1.1), and masks
// the trailers once the body has ended. A compressed container (container) is
// decoded, masked and compressed again.
func (sc *scrubber) scrubBody(resp *http.Response) error {
	b := &sc.rb
	*b = scrubbedBody{sc: sc, resp: resp, raw: resp.Body}
	src := io.Reader(resp.Body)
	if coding := fieldValue(resp.Header, "Content-Encoding"); encoded(coding) && resp.ContentLength != 0 {
		src = b.coded.peekByte(src)
		if !b.hold(scrub.DecodeCost(coding, b.coded.first())) {
			return errScrubMemory
		}
		dec, err := sc.set.DecodeReader(src, coding)
		if err != nil {
			b.closeCoders()
			return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: "content_encoding", Err: errors.Join(errUndecodable, err)}
		}
		b.coders, src = append(b.coders, dec), dec
		inject.Remove(resp.Header, "Content-Encoding")
		unframe(resp)
	}
	if err := sc.container(resp, src); err != nil {
		b.closeCoders()
		if err == errScrubMemory {
			return err
		}
		return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: "compressed_container", Err: errors.Join(errContainer, err)}
	}
	sc.body = b.r
	resp.Body = b
	return nil
}

// container sets the body's readers: the masker over src, and what the client reads.
// That is the masker itself, but for a compressed container — a body whose own type
// is gzip, zstd, brotli or zlib (a .gz download, not a Content-Encoding), or that
// starts with gzip or zstd magic without saying what it is — which is decoded, masked
// and compressed again in its format, since the client asked for the container. A
// container no decoder reads (zip, bzip2, xz, ...) is an error.
func (sc *scrubber) container(resp *http.Response, src io.Reader) error {
	b := &sc.rb
	ctype := fieldValue(resp.Header, "Content-Type")
	var head []byte
	if resp.ContentLength != 0 && scrub.Sniffs(ctype) {
		// The head waits for the body's first bytes (a .gz may be served as any of these).
		head = b.sniffed.peek(src)
		src = &b.sniffed
	}
	coding, err := scrub.Container(ctype, head)
	if err != nil || coding == "" {
		b.plain(src)
		return err
	}
	if !b.hold(scrub.DecodeCost(coding, -1) + scrub.EncodeCost(coding)) {
		return errScrubMemory
	}
	dec, err := sc.set.DecodeReader(src, coding)
	if err != nil {
		return err
	}
	b.coders = append(b.coders, dec)
	b.r = sc.set.Reader(dec)
	enc, err := scrub.EncodeReader(b.r, coding)
	if err != nil {
		return err
	}
	b.coders, b.out = append(b.coders, enc), enc
	unframe(resp)
	return nil
}

// plain has the client read src masked as it streams.
func (b *scrubbedBody) plain(src io.Reader) {
	b.r = b.sc.set.Reader(src).Paced(scrubPause)
	b.out = b.r
}

// unframe drops the body's length: what the client gets is not what the upstream
// framed, and the writers re-frame it (chunked on HTTP/1.1).
func unframe(resp *http.Response) {
	inject.Remove(resp.Header, "Content-Length")
	resp.ContentLength = -1
}

// encoded reports whether a Content-Encoding value names a coding other than identity.
func encoded(coding string) bool {
	if coding == "" {
		return false
	}
	for _, c := range strings.Split(coding, ",") {
		if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
			return true
		}
	}
	return false
}

// scrubbedBody is a response body read through the scrubber.
type scrubbedBody struct {
	sc      *scrubber
	resp    *http.Response
	raw     io.ReadCloser // the upstream's body
	coders  []io.Closer   // its decoders, and the container's encoder
	r       *scrub.Reader
	out     io.Reader   // what the client reads: r, or r compressed again
	sniffed sniffReader // the body's first bytes, when container looked at them
	coded   sniffReader // the compressed body's first byte, read for its window
	held    int64       // what its coders hold of the memory budget (holder Scrub)
	done    bool
}

// errScrubMemory refuses a response whose decoders the memory budget cannot hold.
var errScrubMemory = &refusal{Reason: allowlist.ReasonOverloaded, Detail: membudget.Scrub.Detail(),
	Err: errors.New("limits.memory reached: too many compressed responses being scrubbed at once")}

// hold reserves n more bytes for the body's coders, until closeCoders: an upstream
// was asked for identity (narrowForScrub), so a compressed answer comes from one
// that ignores it, or is a compressed download, and a decoder's window is the
// sender's choice. A hook call's never fails: its answer is egressd's to give.
func (b *scrubbedBody) hold(n int64) bool {
	mem := b.sc.x.snap.mem
	if b.sc.x.hook != nil {
		mem.Take(membudget.Scrub, n)
	} else if !mem.Reserve(membudget.Scrub, n) {
		return false
	}
	b.held += n
	return true
}

// sniffReader is a body whose first bytes were read to sniff it. Its first Read
// returns them and, in the same call, what one read of the rest gives, so the
// sniff costs the client no extra write.
type sniffReader struct {
	src  io.Reader
	buf  [scrub.SniffLen]byte
	head []byte // the sniffed bytes not yet returned
}

// peek reads the first scrub.SniffLen bytes of src (fewer when it ends or
// fails first: a later Read meets that again) and returns them.
func (h *sniffReader) peek(src io.Reader) []byte {
	n, _ := io.ReadFull(src, h.buf[:])
	h.src, h.head = src, h.buf[:n]
	return h.head
}

// peekByte reads src's first byte (none when it ends or fails first: a later
// Read meets that again), to be read again through h.
func (h *sniffReader) peekByte(src io.Reader) io.Reader {
	n, _ := io.ReadFull(src, h.buf[:1])
	h.src, h.head = src, h.buf[:n]
	return h
}

// first is the byte peekByte read, or -1.
func (h *sniffReader) first() int {
	if len(h.head) == 0 {
		return -1
	}
	return int(h.head[0])
}

func (h *sniffReader) Read(p []byte) (int, error) {
	n := copy(p, h.head)
	h.head = h.head[n:]
	if len(h.head) > 0 || n == len(p) && n > 0 {
		return n, nil
	}
	m, err := h.src.Read(p[n:])
	return n + m, err
}

// maxTrailerDrain bounds what is read of a compressed body past the end of its
// compressed stream, to reach the trailers and keep the connection.
const maxTrailerDrain = 64 << 10

func (b *scrubbedBody) Read(p []byte) (int, error) {
	n, err := b.out.Read(p)
	b.sc.update()
	if err == io.EOF && !b.done {
		b.done = true
		if b.closeCoders() {
			io.CopyN(io.Discard, b.raw, maxTrailerDrain)
		}
		b.sc.add(b.sc.fields(b.resp.Trailer))
	}
	return n, err
}

// closeCoders closes the decoders and encoder, and reports whether there were any.
func (b *scrubbedBody) closeCoders() bool {
	had := len(b.coders) > 0
	for _, c := range b.coders {
		c.Close()
	}
	b.coders = nil
	b.sc.x.snap.mem.Release(membudget.Scrub, b.held)
	b.held = 0
	return had
}

func (b *scrubbedBody) Close() error {
	b.closeCoders()
	return b.raw.Close()
}

// upgrade arranges for the upstream's side of a switched connection to be masked:
// WebSocket frames by the frame-aware scrubber, any other protocol as a byte
// stream. An upgrade that negotiated an extension (the request offered none, see
// narrowForScrub) could compress its frames, and is refused.
func (sc *scrubber) upgrade(resp *http.Response) error {
	if len(headerValues(resp.Header, "Sec-WebSocket-Extensions")) > 0 {
		return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: "websocket_extension",
			Err: errors.New("the upstream negotiated a WebSocket extension on an injected upgrade")}
	}
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return nil // serveUpgrade refuses it
	}
	r := sc.set.Reader(up)
	if strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		r = sc.set.WebSocket(up)
	}
	sc.body = r
	resp.Body = &scrubbedConn{ReadWriteCloser: up, r: r, sc: sc}
	return nil
}

// scrubbedConn is a switched connection whose reads (upstream to client) are masked.
type scrubbedConn struct {
	io.ReadWriteCloser
	r  *scrub.Reader
	sc *scrubber
}

func (c *scrubbedConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.sc.update()
	return n, err
}

// refusedResponse renders err as a response the writers send like any other.
func refusedResponse(snap *Snapshot, rec *Record, err error) *http.Response {
	code, h, body := refusalFor(snap, rec, err, 0)
	return &http.Response{
		StatusCode: code, ProtoMajor: 1, ProtoMinor: 1, Header: h,
		ContentLength: int64(len(body)), Body: io.NopCloser(strings.NewReader(string(body))),
	}
}

// A client's byte range on an exchange whose response is scrubbed is served by
// egressd, not the upstream: the upstream is asked for the whole body
// (narrowForScrub), the body is masked with every value in its full context, and
// the client is sent the part it asked for, as a 206 with its Content-Range. A
// part the upstream cut could split a value where no form is found, and an
// upstream that reflects what it was sent could then hand a value back piece by
// piece. Only a single range over a body of known length is served so (what S3
// clients and download managers send); anything else gets the whole body with
// 200, which HTTP allows. The cost is the upstream's whole body for every part.

// byteRange is one range of a Range header: first-last (last < 0: to the end),
// or the last suffix bytes.
type byteRange struct {
	set         bool
	first, last int64
	suffix      int64
	ifRange     string // the request's If-Range, served only when the response matches it
}

// wantedRange reads out's single byte range and If-Range, before narrowForScrub
// removes them; zero when there is none it can serve.
func wantedRange(out *http.Request) byteRange {
	v := out.Header.Get("Range")
	if out.Method != http.MethodGet || v == "" || len(out.Header.Values("Range")) != 1 {
		return byteRange{}
	}
	unit, spec, ok := strings.Cut(strings.TrimSpace(v), "=")
	if !ok || !strings.EqualFold(unit, "bytes") || strings.Contains(spec, ",") {
		return byteRange{}
	}
	a, b, _ := strings.Cut(strings.TrimSpace(spec), "-")
	r := byteRange{set: true, last: -1, ifRange: out.Header.Get("If-Range")}
	var err error
	switch {
	case a == "":
		r.suffix, err = strconv.ParseInt(b, 10, 64)
		r.set = err == nil && r.suffix > 0
	case b == "":
		r.first, err = strconv.ParseInt(a, 10, 64)
		r.set = err == nil && r.first >= 0
	default:
		var errLast error
		r.first, err = strconv.ParseInt(a, 10, 64)
		r.last, errLast = strconv.ParseInt(b, 10, 64)
		r.set = err == nil && errLast == nil && r.first >= 0 && r.last >= r.first
	}
	return r
}

// bounds resolves r against a body of total bytes; ok is false when it is
// unsatisfiable (the whole body is then sent).
func (r byteRange) bounds(total int64) (first, last int64, ok bool) {
	first, last = r.first, r.last
	if r.suffix > 0 {
		first, last = max(0, total-r.suffix), total-1
	}
	if last < 0 || last >= total {
		last = total - 1
	}
	return first, last, first < total
}

// matches reports whether resp is the representation If-Range names: a strong
// ETag or the Last-Modified date, compared exactly (RFC 9110 section 13.1.5).
func (r byteRange) matches(resp *http.Response) bool {
	if r.ifRange == "" {
		return true
	}
	etag := resp.Header.Get("ETag")
	if strings.HasPrefix(r.ifRange, `"`) {
		return etag == r.ifRange && !strings.HasPrefix(etag, "W/")
	}
	return r.ifRange == resp.Header.Get("Last-Modified")
}

// serveRange turns a scrubbed 200 of known length into the 206 of the client's
// range, when there is one it can serve; resp is left whole otherwise.
func (x *exchange) serveRange(resp *http.Response) {
	r := x.wanted
	if !r.set || resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 || !r.matches(resp) {
		return
	}
	first, last, ok := r.bounds(resp.ContentLength)
	if !ok {
		return
	}
	resp.StatusCode, resp.Status = http.StatusPartialContent, "206 Partial Content"
	resp.Header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, resp.ContentLength))
	resp.ContentLength = last - first + 1
	resp.Header.Del("Content-Length") // the writers frame it from ContentLength
	resp.Body = &rangeBody{ReadCloser: resp.Body, skip: first, left: resp.ContentLength}
}

// rangeBody is the part [skip, skip+left) of a body that is read, and masked, from
// its start.
type rangeBody struct {
	io.ReadCloser
	skip, left int64
}

func (b *rangeBody) Read(p []byte) (int, error) {
	if b.skip > 0 {
		n, err := io.CopyN(io.Discard, b.ReadCloser, b.skip)
		b.skip -= n
		if err != nil {
			return 0, err
		}
	}
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}
