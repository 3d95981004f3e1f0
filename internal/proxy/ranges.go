package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

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
