package placeholder

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/credential"
)

// benchReplacer has one environment_variable credential allowed in every location of
// api.example.com.
func benchReplacer() (*Replacer, string) {
	key := []byte("bench-key-bench-key-bench-key-32")
	r := New(key, "env", map[string]string{"K": "k"}, nil, creds{"k": {Env: &credential.EnvVar{
		Value: "sk-0123456789abcdef0123456789abcdef", Locations: []string{"body", "header", "query"},
		TrustedDomains: []string{"api.example.com"}}}})
	return r, r.Env()["K"]
}

func benchRequest(body string) *http.Request {
	return &http.Request{Method: "POST", URL: &url.URL{Path: "/v1/chat", RawQuery: "stream=true"},
		Header: http.Header{"Content-Type": {"application/json"}, "Accept": {"*/*"}, "User-Agent": {"agent/1.0"}},
		Body:   io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
}

// BenchmarkApplyBody: a 4 KiB JSON body with the placeholder in it, replaced.
func BenchmarkApplyBody(b *testing.B) {
	r, ph := benchReplacer()
	body := `{"api_key": "` + ph + `", "messages": "` + strings.Repeat("x", 4000) + `"}`
	b.ReportAllocs()
	for b.Loop() {
		req := benchRequest(body)
		if res, err := r.Apply(req, "api.example.com", nil, false); err != nil || len(res.IDs) != 1 {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyNoPlaceholder: the same request without a placeholder (searched, untouched).
func BenchmarkApplyNoPlaceholder(b *testing.B) {
	r, _ := benchReplacer()
	body := `{"messages": "` + strings.Repeat("x", 4000) + `"}`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Apply(benchRequest(body), "api.example.com", nil, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamedBody: a 4 MiB body of unknown length, without a placeholder, read
// through the search as a transport reads it (32 KiB at a time), toward the trusted
// host (replacing) and another (refusing).
func BenchmarkStreamedBody(b *testing.B) {
	r, _ := benchReplacer()
	body := strings.Repeat(`{"messages": "hello there, egressd_p"}`+"\n", 4<<20/39)
	buf := make([]byte, 32<<10)
	for _, host := range []string{"api.example.com", "other.example.com"} {
		b.Run(host, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req := benchRequest(body)
				req.ContentLength = -1
				if _, err := r.Apply(req, host, nil, false); err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{req.Body}, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
