package proxy_test

import (
	"bytes"
	"compress/zlib"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// noteStore is an upstream that keeps what a POST sends and serves it to every
// later GET, to any host name, in the form the query names: a paste service, a
// profile field, a key-value store.
type noteStore struct {
	mu   sync.Mutex
	note string
}

// storedForms are the forms the store serves a note in.
var storedForms = map[string]func(string) string{
	"raw":    func(s string) string { return s },
	"base64": func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"upper":  strings.ToUpper,
	"base32": func(s string) string { return base32.StdEncoding.EncodeToString([]byte(s)) },
	"utf16le": func(s string) string {
		var b []byte
		for _, u := range utf16.Encode([]rune(s)) {
			b = binary.LittleEndian.AppendUint16(b, u)
		}
		return string(b)
	},
}

func (n *noteStore) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.Method == http.MethodPost {
		b, _ := io.ReadAll(r.Body)
		n.note = string(b)
		rw.WriteHeader(http.StatusCreated)
		return
	}
	note := storedForms[r.URL.Query().Get("form")](n.note)
	rw.Header().Set("X-Note", base64.StdEncoding.EncodeToString([]byte(n.note)))
	rw.Header().Set("Content-Type", "text/plain")
	io.WriteString(rw, "note: "+note)
}

// TestStoredValueMasked: a placeholder POSTed to its trusted domain is replaced,
// and the upstream stores the value; later plain GETs, which carry no placeholder
// and have nothing injected, get it back masked in every form, from the trusted
// domain and from another host egressd sees (plain HTTP).
func TestStoredValueMasked(t *testing.T) {
	w := newPlaceholderWorld(t)
	w.Upstream.set((&noteStore{}).ServeHTTP)
	c := w.interceptingClient()
	post, _ := http.NewRequest("POST", "https://api.allowed.test/notes", strings.NewReader(w.ph("EV_KEY")))
	post.Header.Set("Content-Type", "text/plain")
	resp, err := c.Do(post)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %v %v", resp, err)
	}
	resp.Body.Close()
	for form, enc := range storedForms {
		resp, err := c.Get("https://api.allowed.test/notes?form=" + form)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "note: " + stars(len(enc(envValue))); string(body) != want {
			t.Errorf("%s: body %q, want %q", form, body, want)
		}
		if x := resp.Header.Get("X-Note"); strings.Trim(x, "*") != "" {
			t.Errorf("%s: header %q, want it masked", form, x)
		}
	}
	resp = w.raw("GET http://other.test/notes?form=raw HTTP/1.1\r\nHost: other.test\r\n\r\n")
	body, _ := io.ReadAll(resp.Body)
	if want := "note: " + stars(len(envValue)); string(body) != want {
		t.Errorf("plain HTTP to another host: body %q, want %q", body, want)
	}
	if n, _ := w.lastLog("")["scrubbed"].(float64); n < 1 {
		t.Errorf("log line: scrubbed %v", n)
	}
}

// refusalOf reads a fetched response as a refusal.
func refusalOf(t *testing.T, got fetched, status int, reason, detail string) {
	t.Helper()
	got.resp.Body = io.NopCloser(bytes.NewReader(got.body))
	assertRefused(t, got.resp, status, reason, detail)
}

// TestScrubRange: on an exchange whose response is scrubbed, Range and If-Range
// never reach the upstream (a range could cut a value in two, and a cut value is
// not found), and a partial answer (206, multipart/byteranges) is refused; where
// there is nothing to scrub, both pass.
func TestScrubRange(t *testing.T) {
	w := newScrubWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		value, _ := injected(r)
		rw.Header().Set("X-Seen-Range", r.Header.Get("Range")+r.Header.Get("Request-Range")+"|"+r.Header.Get("If-Range"))
		switch r.URL.Path {
		case "/always206":
			rw.Header().Set("Content-Range", "bytes 0-9/100")
			rw.WriteHeader(http.StatusPartialContent)
			io.WriteString(rw, (value + "0123456789")[:10])
		case "/byteranges":
			rw.Header().Set("Content-Type", "multipart/byteranges; boundary=b")
			io.WriteString(rw, "--b\r\nContent-Range: bytes 0-9/100\r\n\r\n"+value[:10]+"\r\n--b--\r\n")
		default:
			http.ServeContent(rw, r, "f.txt", time.Time{}, strings.NewReader("0123456789 "+value+" tail"))
		}
	})
	value := "Bearer " + secretToken
	ranged := http.Header{"Range": {"bytes=11-20"}, "Request-Range": {"bytes=11-20"}, "If-Range": {`"v1"`}}
	for _, proto := range protos {
		got := w.fetch(t, proto, "api.allowed.test", "/file", ranged)
		if got.resp.StatusCode != http.StatusOK || got.resp.Header.Get("X-Seen-Range") != "|" {
			t.Errorf("%s: %s, the upstream saw Range|If-Range %q", proto, got.resp.Status, got.resp.Header.Get("X-Seen-Range"))
		}
		if want := "0123456789 " + stars(len(value)) + " tail"; string(got.body) != want {
			t.Errorf("%s: body %q, want %q", proto, got.body, want)
		}
		// Without If-Range (or with one the response matches), egressd cuts the range
		// from the whole masked body: the part of the value in it is masked too.
		got = w.fetch(t, proto, "api.allowed.test", "/file", http.Header{"Range": {"bytes=5-20"}})
		if want := ("0123456789 " + stars(len(value)) + " tail")[5:21]; got.resp.StatusCode != http.StatusPartialContent ||
			string(got.body) != want || got.resp.Header.Get("X-Seen-Range") != "|" {
			t.Errorf("%s: %s %q, the upstream saw %q; want 206 %q cut by egressd", proto, got.resp.Status, got.body,
				got.resp.Header.Get("X-Seen-Range"), want)
		}
		for _, path := range []string{"/always206", "/byteranges"} {
			got := w.fetch(t, proto, "api.allowed.test", path, ranged)
			refusalOf(t, got, http.StatusBadGateway, "upstream_unreachable", "partial_content")
			assertNoLeak(t, proto+" "+path, got.raw)
		}
	}
	resp := w.raw("GET http://other.test/file HTTP/1.1\r\nHost: other.test\r\nRange: bytes=0-3\r\n\r\n")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPartialContent || string(body) != "0123" || resp.Header.Get("X-Seen-Range") != "bytes=0-3|" {
		t.Errorf("nothing to scrub: %s %q, the upstream saw %q; want the range passed through", resp.Status, body, resp.Header.Get("X-Seen-Range"))
	}
}

// decompressed is body decoded from coding, by the real libraries.
func decompressed(t *testing.T, coding string, body []byte) []byte {
	t.Helper()
	var r io.Reader
	var err error
	switch coding {
	case "gzip":
		r, err = gzip.NewReader(bytes.NewReader(body))
	case "deflate":
		r, err = zlib.NewReader(bytes.NewReader(body))
	case "br":
		r = brotli.NewReader(bytes.NewReader(body))
	case "zstd":
		var d *zstd.Decoder
		d, err = zstd.NewReader(bytes.NewReader(body))
		r = d
	}
	if err != nil {
		t.Fatalf("%s: %v", coding, err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", coding, err)
	}
	return out
}

// TestScrubCompressedContainers: a compressed container (the body's own type, no
// Content-Encoding; or gzip or zstd magic in an untyped or octet-stream body) is
// delivered in its format, its content masked; a container that cannot be read,
// or that is not what its type says, is refused.
func TestScrubCompressedContainers(t *testing.T) {
	w := newScrubWorld(t)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		value, _ := injected(r)
		q := r.URL.Query()
		rw.Header()["Content-Type"] = nil // no type, not even a sniffed one
		if ct := q.Get("type"); ct != "" {
			rw.Header().Set("Content-Type", ct)
		}
		body := []byte("[[" + value + "]]")
		if c := q.Get("coding"); c != "" {
			body = compressed(c, body)
		}
		rw.Write(body)
	})
	value := "Bearer " + secretToken
	for _, proto := range protos {
		for _, c := range []struct{ ctype, coding string }{
			{"application/gzip", "gzip"}, {"application/x-gzip", "gzip"}, {"application/zstd", "zstd"},
			{"application/x-brotli", "br"}, {"application/zlib", "deflate"},
			{"", "gzip"}, {"application/octet-stream", "zstd"},
		} {
			got := w.fetch(t, proto, "api.allowed.test", "/c?type="+c.ctype+"&coding="+c.coding, nil)
			// (An untyped body gets a sniffed type from net/http's HTTP/2 server.)
			if got.resp.StatusCode != http.StatusOK || c.ctype != "" && got.resp.Header.Get("Content-Type") != c.ctype ||
				got.resp.Header.Get("Content-Encoding") != "" {
				t.Fatalf("%s %q: %s, %v", proto, c.ctype, got.resp.Status, got.resp.Header)
			}
			plain := decompressed(t, c.coding, got.body)
			if want := "[[" + stars(len(value)) + "]]"; string(plain) != want {
				t.Errorf("%s %q: the container holds %q, want %q", proto, c.ctype, plain, want)
			}
		}
		for _, target := range []string{"/c?type=application/zip", "/c?type=application/x-xz", "/c?type=application/gzip"} {
			got := w.fetch(t, proto, "api.allowed.test", target, nil)
			refusalOf(t, got, http.StatusBadGateway, "upstream_unreachable", "compressed_container")
			assertNoLeak(t, proto+" "+target, got.raw)
		}
	}
}
