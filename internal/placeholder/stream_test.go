package placeholder

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
)

// streamValue is the value of credential "k", which may go in the body of requests to
// t.test only.
const streamValue = "V<&>value"

// noPauses rules out a pause release for the rest of the test: its sources never
// pause, and the machine's load must not make them seem to.
func noPauses(t testing.TB) {
	was := pauseRelease
	pauseRelease = time.Hour
	t.Cleanup(func() { pauseRelease = was })
}

func streamReplacer() (*Replacer, string) {
	key := []byte("stream-key-stream-key-stream-key")
	r := New(key, "e", map[string]string{"K": "k"}, []string{"other"}, creds{
		"k":     {Env: &credential.EnvVar{Value: streamValue, Locations: []string{"body", "header"}, TrustedDomains: []string{"t.test"}}},
		"other": {Env: &credential.EnvVar{Value: "other-value", Locations: []string{"body"}, TrustedDomains: []string{"o.test"}}},
	})
	return r, r.Env()["K"]
}

// streamedRequest is a request whose body (of unknown length, so streamed) src is.
func streamedRequest(src io.Reader) *http.Request {
	return &http.Request{Method: "POST", URL: &url.URL{Path: "/"}, Header: http.Header{},
		Body: io.NopCloser(src), ContentLength: -1}
}

// chunks returns the pieces as one reader that returns one piece per Read.
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	if (*c)[0] = (*c)[0][n:]; len((*c)[0]) == 0 {
		*c = (*c)[1:]
	}
	return n, nil
}

// TestStreamedBodySplitAtEveryOffset: a placeholder cut in two reads at every offset is
// replaced whole toward the trusted host, and toward another host ends the body with
// credential_scope before any byte of it has been read (the bytes before it have).
func TestStreamedBodySplitAtEveryOffset(t *testing.T) {
	noPauses(t)
	r, ph := streamReplacer()
	body := []byte("head " + ph + " tail")
	for cut := 1; cut < len(body); cut++ {
		src := chunks{body[:cut], body[cut:]}
		req := streamedRequest(&src)
		res, err := r.Apply(req, "t.test", nil, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(req.Body)
		if err != nil || string(got) != "head "+streamValue+" tail" || req.ContentLength != -1 || res.Refused() != nil {
			t.Fatalf("cut %d: %q, %v (Content-Length %d)", cut, got, err, req.ContentLength)
		}

		src = chunks{body[:cut], body[cut:]}
		req = streamedRequest(&src)
		if res, err = r.Apply(req, "x.test", nil, false); err != nil {
			t.Fatal(err)
		}
		got, err = io.ReadAll(req.Body)
		var se *ScopeError
		if !errors.As(err, &se) || se.Location != "body" || se.ID != "k" || !errors.Is(res.Refused(), err) {
			t.Fatalf("cut %d: %v, want a ScopeError in the body", cut, err)
		}
		if !strings.HasPrefix("head ", string(got)) {
			t.Fatalf("cut %d: read %q before the refusal: bytes of the placeholder left", cut, got)
		}
	}
}

// TestStreamedBodyLargeKeepsMemory: 2 MiB with the placeholder at the end is refused
// at the end; the same body to the trusted host is replaced, every byte before intact.
func TestStreamedBodyLarge(t *testing.T) {
	r, ph := streamReplacer()
	filler := bytes.Repeat([]byte("a"), 2<<20)
	body := append(append([]byte{}, filler...), ph...)
	req := &http.Request{Method: "POST", URL: &url.URL{Path: "/"}, Header: http.Header{},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
	if _, err := r.Apply(req, "x.test", nil, false); err != nil {
		t.Fatal(err)
	}
	if req.ContentLength != int64(len(body)) {
		t.Errorf("a body nothing may be replaced in changed length: %d", req.ContentLength)
	}
	n, err := io.Copy(io.Discard, req.Body)
	var se *ScopeError
	if !errors.As(err, &se) || n > int64(len(filler)) {
		t.Fatalf("read %d bytes, %v; want the filler at most, then a ScopeError", n, err)
	}

	req = &http.Request{Method: "POST", URL: &url.URL{Path: "/"}, Header: http.Header{},
		Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
	res, err := r.Apply(req, "t.test", nil, false)
	if err != nil || req.ContentLength != -1 || len(res.IDs) != 1 {
		t.Fatalf("%v: Content-Length %d, IDs %v; want a streamed body of unknown length, k", err, req.ContentLength, res.IDs)
	}
	got, err := io.ReadAll(req.Body)
	if err != nil || !bytes.Equal(got, append(filler, streamValue...)) {
		t.Fatalf("replaced body: %d bytes, %v", len(got), err)
	}
}

// pausedSource returns its first piece, then waits for more on next.
type pausedSource struct {
	first []byte
	next  chan []byte
}

func (p *pausedSource) Read(b []byte) (int, error) {
	if len(p.first) > 0 {
		n := copy(b, p.first)
		p.first = p.first[n:]
		return n, nil
	}
	more, ok := <-p.next
	if !ok {
		return 0, io.EOF
	}
	return copy(b, more), nil
}

// readWithin reads once from r, or reports that nothing came within d.
func readWithin(r io.Reader, d time.Duration) (string, bool) {
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		n, _ := r.Read(b)
		got <- string(b[:n])
	}()
	select {
	case s := <-got:
		return s, true
	case <-time.After(d):
		return "", false
	}
}

// TestStreamedBodyReleasesOnPause: a message that ends in a beginning of the prefix
// ("msg e") is released once the client pauses (a gRPC stream must not wait for its
// next message); a placeholder completed after that is refused out of scope, and
// cannot be replaced in scope (ErrSplit). A held suffix with the whole prefix waits.
func TestStreamedBodyReleasesOnPause(t *testing.T) {
	r, ph := streamReplacer()
	for _, host := range []string{"x.test", "t.test"} {
		src := &pausedSource{first: []byte("msg e"), next: make(chan []byte, 1)}
		req := streamedRequest(src)
		res, _ := r.Apply(req, host, nil, false)
		var got string
		for got != "msg e" {
			s, ok := readWithin(req.Body, 2*time.Second)
			if !ok {
				t.Fatalf("%s: %q read, the rest held back while the client pauses", host, got)
			}
			got += s
		}
		src.next <- []byte(ph[1:])
		_, err := io.ReadAll(req.Body)
		var se *ScopeError
		if host == "x.test" && !errors.As(err, &se) || host == "t.test" && !errors.Is(err, ErrSplit) || res.Refused() == nil {
			t.Errorf("%s: %v after a split placeholder", host, err)
		}
	}

	src := &pausedSource{first: []byte("msg " + ph[:len(Prefix)+2]), next: make(chan []byte, 1)}
	req := streamedRequest(src)
	r.Apply(req, "t.test", nil, false)
	if s, _ := readWithin(req.Body, time.Second); s != "msg " {
		t.Fatalf("read %q, want the bytes before the prefix", s)
	}
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(req.Body); got <- b }()
	select {
	case b := <-got:
		t.Fatalf("released %q: a held prefix must wait for the rest", b)
	case <-time.After(200 * time.Millisecond):
	}
	src.next <- []byte(ph[len(Prefix)+2:])
	close(src.next)
	if rest := <-got; string(rest) != streamValue {
		t.Errorf("rest %q; want the value", rest)
	}
}

// TestApplyRefusesWhereNoCredentialGoes: the path (raw, percent-encoded in either
// case), a header name (re-cased), a declared trailer name and, when the body ends, a
// trailer value are never locations, even toward the trusted host.
func TestApplyRefusesWhereNoCredentialGoes(t *testing.T) {
	r, ph := streamReplacer()
	upper := strings.ReplaceAll(ph, "_", "%5F")
	lower := strings.ReplaceAll(url.PathEscape(ph), "_", "%5f")
	cases := map[string]func(*http.Request){
		"path":            func(q *http.Request) { q.URL.Path = "/a/" + ph },
		"path, %5F":       func(q *http.Request) { q.URL.RawPath = "/a/" + upper; q.URL.Path = "/a/" + ph },
		"path, %5f only":  func(q *http.Request) { q.URL.Opaque = "/a/" + lower },
		"header name":     func(q *http.Request) { q.Header[http.CanonicalHeaderKey("x-"+ph)] = []string{"1"} },
		"trailer name":    func(q *http.Request) { q.Trailer = http.Header{"X-" + ph: nil} },
		"trailer at end":  func(q *http.Request) { q.Trailer = http.Header{"X-T": {ph}} },
		"unknown trailer": func(q *http.Request) { q.Trailer = http.Header{"X-T": {"a", "b" + ph}} },
	}
	want := map[string]string{"path": "path", "path, %5F": "path", "path, %5f only": "path", "header name": "header_name"}
	for name, set := range cases {
		req := streamedRequest(strings.NewReader("body"))
		set(req)
		_, err := r.Apply(req, "t.test", nil, false)
		if strings.Contains(name, "trailer") && err == nil {
			_, err = io.ReadAll(req.Body)
		}
		var se *ScopeError
		loc := want[name]
		if loc == "" {
			loc = "trailer"
		}
		if !errors.As(err, &se) || se.Location != loc || se.ID != "k" {
			t.Errorf("%s: %v, want a ScopeError in the %s", name, err, loc)
		}
	}
}

// sized returns src in reads of the sizes (1 to 64 bytes), cycling.
type sized struct {
	src   []byte
	sizes []byte
	i     int
}

func (s *sized) Read(p []byte) (int, error) {
	if len(s.src) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(s.sizes) > 0 {
		n = int(s.sizes[s.i%len(s.sizes)])%64 + 1
		s.i++
	}
	n = copy(p[:min(n, len(p))], s.src)
	s.src = s.src[n:]
	return n, nil
}

// FuzzBodyStream: whatever the body and however it is cut into reads, the streamed
// body toward the trusted host is the body with every placeholder replaced (the same
// as the buffered one), and toward another host either the body unchanged or, when it
// holds a placeholder, a ScopeError after a part that holds none.
func FuzzBodyStream(f *testing.F) {
	noPauses(f)
	r, ph := streamReplacer()
	other := Derive([]byte("stream-key-stream-key-stream-key"), "e", "other")
	f.Add([]byte("a"), []byte("b"), []byte{3, 7}, true)
	f.Add([]byte("egressd_ph_"), []byte(ph), []byte{0}, true)
	f.Add([]byte(ph[:20]), []byte(ph[20:]+ph), []byte{10, 1}, false)
	f.Add([]byte("x"+other), []byte(""), []byte{5}, true)
	f.Fuzz(func(t *testing.T, pre, post, sizes []byte, withPH bool) {
		body := append([]byte{}, pre...)
		if withPH {
			body = append(body, ph...)
		}
		body = append(body, post...)
		holdsOther := bytes.Contains(body, []byte(other))

		req := streamedRequest(&sized{src: body, sizes: sizes})
		if _, err := r.Apply(req, "t.test", nil, false); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(req.Body)
		buffered := &http.Request{URL: &url.URL{}, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
		_, berr := r.Apply(buffered, "t.test", nil, false)
		switch {
		case holdsOther && (err == nil || berr == nil):
			t.Fatalf("another credential's placeholder toward t.test: %v, %v", err, berr)
		case holdsOther:
		case err != nil || berr != nil:
			t.Fatalf("%v, %v", err, berr)
		case !bytes.Equal(got, bytes.ReplaceAll(body, []byte(ph), []byte(streamValue))):
			t.Fatalf("streamed %q from %q", got, body)
		default:
			if b, _ := io.ReadAll(buffered.Body); !bytes.Equal(b, got) {
				t.Fatalf("buffered %q, streamed %q", b, got)
			}
		}

		req = streamedRequest(&sized{src: body, sizes: sizes})
		r.Apply(req, "x.test", nil, false)
		got, err = io.ReadAll(req.Body)
		var se *ScopeError
		switch holds := bytes.Contains(body, []byte(ph)) || holdsOther; {
		case holds && !errors.As(err, &se):
			t.Fatalf("%q passed with a placeholder: %v", body, err)
		case holds && !bytes.HasPrefix(body, got), holds && bytes.Contains(got, []byte(Prefix)) && !bytes.Contains(body[:len(got)+len(Prefix)], []byte(Prefix)):
			t.Fatalf("read %q of %q before the refusal", got, body)
		case !holds && (err != nil || !bytes.Equal(got, body)):
			t.Fatalf("%q became %q, %v", body, got, err)
		}
	})
}
