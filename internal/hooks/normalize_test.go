package hooks

import (
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "/"},
		{"/", "/"},
		{"/pre", "/pre"},
		{"/a/../pre", "/pre"},              // §5.2.4
		{"/./pre", "/pre"},                 // §5.2.4
		{"/../../pre", "/pre"},             // above the root stays at the root
		{"/a/b/../../pre/.", "/pre/"},      // a final dot segment leaves the slash
		{"/a/..", "/"},                     // resolves to the root
		{"/%70re", "/pre"},                 // unreserved decoded (§6.2.2.2)
		{"/%2e%2E/pre", "/pre"},            // %2e is a dot, then a dot segment
		{"/a/%2e%2e/pre", "/pre"},          // as WHATWG fetch sends it
		{"/%7Euser/%41", "/~user/A"},       // unreserved decoded, any case
		{"/p%2fq", "/p%2Fq"},               // an encoded slash stays encoded, hex upper-cased
		{"/a%2F..%2Fpre", "/a%2F..%2Fpre"}, // one segment: not a dot segment
		{"/a/..%2Fpre", "/a/..%2Fpre"},     // "..%2Fpre" is one segment
		{"/x%c3%a9", "/x%C3%A9"},           // non-ASCII stays encoded, upper-cased
		{"//pre", "//pre"},                 // empty segments are kept
		{"/a//../pre", "/a/pre"},           // ".." removes the empty segment only
		{"/pre;v=1", "/pre;v=1"},           // path parameters are part of the segment
		{"/pre%3Bv=1", "/pre%3Bv=1"},       // reserved characters stay encoded
		{"/100%", "/100%"},                 // a malformed escape is compared as it stands
		{"/%zz/../pre", "/%zz/../pre"},     // and so is a path url.Parse refuses
		{"pre", "/pre"},                    // a path without its slash
		{"/a/./b/../../c/", "/c/"},         // RFC 3986 §5.2.4's own example, shape
		{"/a/b/c/./../../g", "/a/g"},       // RFC 3986 §5.2.4's example
		{"/mid/content=5/../6", "/mid/6"},  // RFC 3986 §5.2.4's example
		{"/hooks/PRE", "/hooks/PRE"},       // paths stay case-sensitive
		{"/%2520", "/%2520"},               // decoding is one level only
		{"/%41%2e%2e/pre", "/A../pre"},     // "A.." is not a dot segment
		{"/%2e%2e%2fpre", "/..%2Fpre"},     // the encoded slash keeps ".." inside a segment
	} {
		if got := NormalizePath(tc.in); got != tc.want {
			t.Errorf("NormalizePath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLookupNormalises: a request spelling the hook path in another form is the hook
// call (and so is signed and failed closed), and so is a hooks.json URL written in
// another form.
func TestLookupNormalises(t *testing.T) {
	ix := NewIndex(mustParse(t, `{"g": {"pre_tool_execution": [{"matcher": "code_execution", "hooks": [
		{"type": "http", "url": "https://policy.example/pre", "timeout": 5},
		{"type": "http", "url": "HTTPS://Written.EXAMPLE:443/v1/./x/../%63heck", "timeout": 5}
	]}]}}`))
	for _, tc := range []struct {
		host, path string
		ok         bool
	}{
		{"policy.example", "/pre", true},
		{"policy.example", "/a/../pre", true},
		{"policy.example", "/%70re", true},
		{"policy.example", "/%70%52%45", false}, // decoding keeps case: /pRE
		{"policy.example", "/./pre", true},
		{"policy.example", "/a/%2e%2e/pre", true},
		{"policy.example", "/x/../../pre", true},
		{"policy.example", "/a%2F..%2Fpre", false}, // an encoded slash is not a separator
		{"policy.example", "//pre", false},
		{"policy.example", "/pre;x", false},
		{"written.example", "/v1/check", true},
		{"written.example", "/v1/x/../check", true},
		{"written.example", "/v1/./x/../%63heck", true},
	} {
		if _, ok := ix.Lookup("https", tc.host, 443, tc.path); ok != tc.ok {
			t.Errorf("Lookup(%s%s) = %t, want %t", tc.host, tc.path, ok, tc.ok)
		}
	}
}

func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/a/../pre", "/%70re", "/a%2F..%2Fpre", "//x/./y/..", "/%2e%2E/", "/100%", ";", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		n := NormalizePath(p)
		if !strings.HasPrefix(n, "/") {
			t.Fatalf("NormalizePath(%q) = %q: no leading slash", p, n)
		}
		if again := NormalizePath(n); again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q", p, n, again)
		}
		if n != p && NormalizePath(p) != n {
			t.Fatalf("not deterministic: %q", p)
		}
	})
}
