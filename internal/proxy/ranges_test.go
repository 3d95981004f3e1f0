package proxy

import (
	"net/http"
	"testing"
)

// TestWantedRange: the ranges egressd cuts itself (a single bytes= range of a GET),
// resolved against a body of 100 bytes; anything else leaves the body whole.
func TestWantedRange(t *testing.T) {
	cases := []struct {
		method, rng string
		first, last int64
		ok          bool
	}{
		{"GET", "bytes=0-9", 0, 9, true},
		{"GET", "bytes=90-", 90, 99, true},
		{"GET", "bytes=-10", 90, 99, true},
		{"GET", "bytes=-500", 0, 99, true},
		{"GET", "bytes=95-200", 95, 99, true},
		{"GET", "BYTES=5-6", 5, 6, true},
		{"GET", "bytes = 5-6", 0, 0, false},
		{"GET", "bytes=100-", 0, 0, false}, // past the end: the whole body
		{"GET", "bytes=0-1,5-6", 0, 0, false},
		{"GET", "bytes=9-3", 0, 0, false},
		{"GET", "bytes=-0", 0, 0, false},
		{"GET", "items=0-9", 0, 0, false},
		{"GET", "bytes=x-9", 0, 0, false},
		{"GET", "bytes=0-x", 0, 0, false}, // not 0-0: an unreadable end is no range at all
		{"HEAD", "bytes=0-9", 0, 0, false},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, "https://h.test/", nil)
		req.Header.Set("Range", c.rng)
		r := wantedRange(req)
		first, last, ok := r.bounds(100)
		ok = ok && r.set
		if ok != c.ok || ok && (first != c.first || last != c.last) {
			t.Errorf("%s %q: %d-%d %v, want %d-%d %v", c.method, c.rng, first, last, ok, c.first, c.last, c.ok)
		}
	}
}

// TestIfRangeMatches: If-Range is honoured only for the representation it names.
func TestIfRangeMatches(t *testing.T) {
	resp := &http.Response{Header: http.Header{"Etag": {`"v1"`}, "Last-Modified": {"Mon, 02 Jan 2006 15:04:05 GMT"}}}
	for ifRange, want := range map[string]bool{
		"": true, `"v1"`: true, `"v2"`: false, `W/"v1"`: false,
		"Mon, 02 Jan 2006 15:04:05 GMT": true, "Tue, 03 Jan 2006 15:04:05 GMT": false,
	} {
		if got := (byteRange{ifRange: ifRange}).matches(resp); got != want {
			t.Errorf("If-Range %q: %v, want %v", ifRange, got, want)
		}
	}
	weak := &http.Response{Header: http.Header{"Etag": {`W/"v1"`}}}
	if (byteRange{ifRange: `W/"v1"`}).matches(weak) {
		t.Error("a weak ETag matched")
	}
}
