package conformance_test

import (
	"net/http"
	"net/url"
	"testing"
)

// TestRedirects: an upstream's redirect to an internal address or to a host off
// the allowlist reaches the client as it was sent, unfollowed; nothing but the
// upstream that answered is contacted, and a credential host's redirect carries
// no credential anywhere.
func TestRedirects(t *testing.T) {
	w := newWorld(t, config{})
	targets := []struct{ name, location string }{
		{"to the metadata address", "http://169.254.169.254/latest/meta-data/iam/security-credentials/"},
		{"to IPv6 metadata", "http://[fd00:ec2::254]/latest/meta-data/"},
		{"to loopback", "http://127.0.0.1/admin"},
		{"to a private address", "http://10.0.0.5/"},
		{"to a cgnat address", "http://100.64.0.5/"},
		{"to a non-allowlisted host", "http://evil.test/collect"},
		{"to a non-allowlisted host over https", "https://evil.test/collect"},
		{"to a name that resolves inside", "http://loopback.allowed.test/"},
	}
	origins := []struct{ name, url string }{
		{"plain", "http://allowed.test/r"},
		{"spliced tunnel", "https://www.allowed.test/r"},
		{"intercepted tunnel with a credential", "https://api.allowed.test/r"},
	}
	for _, o := range origins {
		t.Run(o.name, func(t *testing.T) {
			for _, tc := range targets {
				t.Run(tc.name, func(t *testing.T) {
					k := w.begin(t)
					resp := k.get(o.url + "?redirect=" + url.QueryEscape(tc.location))
					k.body(resp)
					if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != tc.location {
						t.Errorf("got %d Location %q; want 302 %q", resp.StatusCode, resp.Header.Get("Location"), tc.location)
					}
					if r := resp.Header.Get("Egressd-Reason"); r != "" {
						t.Errorf("the upstream's redirect carries Egressd-Reason %q", r)
					}
					k.assertUpstreamSaw(1)
					k.assertNoEgressTo("evil.test")
				})
			}
		})
	}
	t.Run("HTTP/2 redirect from a credential host", func(t *testing.T) {
		k := w.begin(t)
		loc := "https://evil.test/collect"
		req, _ := http.NewRequest(http.MethodGet, "https://api.allowed.test/r?redirect="+url.QueryEscape(loc), nil)
		resp, err := k.h2("api.allowed.test:443").RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		k.body(resp)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != loc {
			t.Errorf("got %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
		}
		k.assertUpstreamSaw(1)
	})
}
