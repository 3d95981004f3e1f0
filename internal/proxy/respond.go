package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// copyBufs holds the buffers responses are streamed through.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// writeHead writes a status line and header fields. Values reach here from net/http's
// parsers or from egressd itself, so they hold no CR or LF.
func writeHead(bw *bufio.Writer, code int, h http.Header, closeConn bool) {
	writeHeadPhrase(bw, code, http.StatusText(code), h, closeConn)
}

// writeHeadPhrase is writeHead with the status line's reason phrase given.
func writeHeadPhrase(bw *bufio.Writer, code int, phrase string, h http.Header, closeConn bool) {
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteByte(' ')
	bw.WriteString(phrase)
	bw.WriteString("\r\n")
	for name, values := range h {
		for _, v := range values {
			bw.WriteString(name)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if closeConn {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// writeResponse streams resp to an HTTP/1.1 client, flushing after every read so
// server-sent events are never held back. It reports whether the connection may
// carry another request.
func writeResponse(bw *bufio.Writer, method string, wantClose bool, resp *http.Response, rec *Record) (bool, error) {
	rec.Status = resp.StatusCode
	removeHopByHop(resp.Header)
	bodyless := bodyless(method, resp.StatusCode)
	chunked := false
	switch {
	case bodyless:
	case resp.ContentLength >= 0:
		resp.Header["Content-Length"] = []string{strconv.FormatInt(resp.ContentLength, 10)}
	case !wantClose:
		chunked = true
		resp.Header["Transfer-Encoding"] = []string{"chunked"}
		removeEgressdHeaders(resp.Trailer)
		if len(resp.Trailer) > 0 {
			resp.Header["Trailer"] = []string{trailerNames(resp.Trailer)}
		}
	default:
		wantClose = true // close-delimited body
	}
	writeHead(bw, resp.StatusCode, resp.Header, wantClose)
	if bodyless {
		return !wantClose, bw.Flush()
	}
	n, err := copyBody(bw, resp.Body, chunked)
	rec.BytesOut += n
	if err != nil {
		return false, err
	}
	if chunked {
		// Every trailer the upstream sent, announced or not (net/http fills
		// resp.Trailer when the body ends), except the ones only egressd sets.
		removeEgressdHeaders(resp.Trailer)
		bw.WriteString("0\r\n")
		for name, values := range resp.Trailer {
			for _, v := range values {
				bw.WriteString(name + ": " + v + "\r\n")
			}
		}
		bw.WriteString("\r\n")
	}
	return !wantClose, bw.Flush()
}

// bodyless reports whether a response to method with status code has no body.
func bodyless(method string, code int) bool {
	return method == http.MethodHead || code/100 == 1 || code == http.StatusNoContent || code == http.StatusNotModified
}

func trailerNames(t http.Header) string {
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// copyBody copies src to bw, chunk-encoded when chunked, flushing after each read.
func copyBody(bw *bufio.Writer, src io.Reader, chunked bool) (int64, error) {
	write := func(p []byte) error {
		_, err := bw.Write(p)
		return err
	}
	if chunked {
		write = func(p []byte) error {
			bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
			bw.WriteString("\r\n")
			bw.Write(p)
			_, err := bw.WriteString("\r\n")
			return err
		}
	}
	return streamBody(src, write, bw.Flush)
}

// streamBody copies src through write, flushing after every read so that nothing
// the upstream has sent waits in a buffer (server-sent events, long polls).
func streamBody(src io.Reader, write func([]byte) error, flush func() error) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if err := write(buf[:n]); err != nil {
				return total, err
			}
			if err := flush(); err != nil {
				return total, err
			}
			total += int64(n)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// writeRefusalRW writes a refusal through an http.ResponseWriter.
func writeRefusalRW(w http.ResponseWriter, snap *Snapshot, rec *Record, err error) {
	code, hdr, body := refusalFor(snap, rec, err, 0)
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
	n, _ := w.Write(body)
	rec.BytesOut += int64(n)
}

// gRPC status codes of egressd's refusals (grpc/codes).
const (
	grpcPermissionDenied = 7
	grpcUnavailable      = 14
)

// isGRPC reports whether req is a gRPC call (application/grpc, +proto and the like).
func isGRPC(req *http.Request) bool {
	return strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc")
}

// writeGRPCRefusal answers a gRPC call's refusal as gRPC clients read one: a
// Trailers-Only response (HTTP 200 with grpc-status and grpc-message in its head),
// PERMISSION_DENIED for a denial and UNAVAILABLE for a failure, the message naming
// the reason, so grpc.Code and status.Message show why. Egressd-Reason is set too.
func writeGRPCRefusal(w http.ResponseWriter, snap *Snapshot, rec *Record, err error) {
	rf := rec.refused(err)
	code := grpcUnavailable
	if rf.Reason.IsDenial() {
		code = grpcPermissionDenied
	}
	msg := "egressd: " + string(rf.Reason) + ": " + rf.Reason.Message(rec.Host, rec.Port, snap.Env, rf.Detail)
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Egressd-Reason", string(rf.Reason))
	h.Set("Grpc-Status", strconv.Itoa(code))
	h.Set("Grpc-Message", grpcPercentEncode(msg))
	w.WriteHeader(http.StatusOK)
	rec.Status = http.StatusOK
}

// grpcPercentEncode encodes a grpc-message value: every byte outside printable
// ASCII, and '%', as %XX (the gRPC over HTTP/2 protocol spec).
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// writeResponseRW streams resp through an http.ResponseWriter (the HTTP/2 side),
// flushing after every read, then sets every trailer the upstream sent, announced
// in a Trailer header or not (gRPC never announces grpc-status): net/http fills
// resp.Trailer when the body ends, and http.TrailerPrefix sends a trailer nobody
// declared.
func writeResponseRW(w http.ResponseWriter, resp *http.Response, rec *Record) {
	rec.Status = resp.StatusCode
	removeHopByHop(resp.Header)
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	n, err := streamBody(resp.Body, func(p []byte) error { _, err := w.Write(p); return err }, rc.Flush)
	rec.BytesOut += n
	if err != nil && !errors.Is(err, io.EOF) {
		rec.Error = err.Error()
		return
	}
	removeEgressdHeaders(resp.Trailer)
	for k, v := range resp.Trailer {
		h[http.TrailerPrefix+k] = v
	}
}
