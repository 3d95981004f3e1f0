package scrub

import (
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// partialValues hold '+', '/' and '=' (a session token, a bearer token), a
// space and '+' (a Basic pair), or a user:password pair whose longest run of
// letters and digits is short: the characters encoders escape in part.
var partialValues = []string{
	"FwoGZXIvYXdzEBYaDHk+Qm9sL2ZyZWVzZQ/tZ3Jvd3RoIhJpbmNyZWFzZQ==",
	"Bearer sk_live_51Hx+Q2eRtY/uIop9As+dF",
	"Basic c3ZjOlB3MDAwMDAwfn4+",
	"svc-deploy:Zq8!vT2#mWx9@pLr4",
}

// partialCases renders v as the encoders that escape some characters and
// not others write it: real encoders where Go has them, a rendering of the
// other languages' rules otherwise.
func partialCases(t *testing.T, v string) []placed {
	t.Helper()
	exec := func(tmpl string) string {
		var b strings.Builder
		if err := template.Must(template.New("").Parse(tmpl)).Execute(&b, v); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	attr := strings.TrimSuffix(strings.TrimPrefix(exec(`<a title={{.}}>`), "<a title="), ">")
	repl := func(pairs ...string) string { return strings.NewReplacer(pairs...).Replace(v) }
	return []placed{
		place("go html/template", exec(`<pre>{{.}}</pre>`)[5:len(exec(`<pre>{{.}}</pre>`))-6]),
		place("go html/template attribute", attr),
		place("html &#61; for = only", repl("=", "&#61;")),
		place("owasp &#x2F;", repl("/", "&#x2F;")),
		place("html hex entities upper X, leading zeros", repl("+", "&#X002B;", "/", "&#x02f;", " ", "&#0032;")),
		place("html decimal leading zeros", repl("+", "&#043;", "=", "&#00061;")),
		place("python quote()", quoteSafe(v, "/", "%%%02X")),
		place("python quote() lower", quoteSafe(v, "/", "%%%02x")),
		place("form encoding + only", repl("+", "%2B")),
		place(".NET System.Text.Json", repl("+", `\u002B`)),
		place("json \\/", repl("/", `\/`)),
		place("json \\u002F", repl("/", `\u002F`)),
		place("json \\u002f", repl("/", `\u002f`)),
		place("json \\/ and \\u002B", repl("/", `\/`, "+", `\u002B`)),
		place("rfc 5987", quoteSafe(v, "!#$&+-.^_`|~", "%%%02X")),
		place("javascript escape()", quoteSafe(v, "@*_+-./", "%%%02X")),
		place("\\xNN in part", repl("+", `\x2b`, "/", `\x2F`)),
		place("\\xNN every byte", everyByte(v, `\x%02x`)),
		place("colon hex", strings.TrimSuffix(everyByte(v, "%02x:"), ":")),
		place("html and json mixed", repl("+", "&#43;", "/", `\u002f`, "=", "%3d")),
	}
}

// quoteSafe percent-encodes v like Python's urllib.parse.quote: letters,
// digits, "_.-~" and safe stay raw.
func quoteSafe(v, safe, format string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if c := v[i]; isAlnum(c) || strings.IndexByte("_.-~"+safe, c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, format, c)
		}
	}
	return b.String()
}

// TestPartialEscapes: each spelling of each value is masked whole (escape
// sequences included) by Set.String, by a Reader fed the body in two reads
// split at every offset, and by one a byte at a time.
func TestPartialEscapes(t *testing.T) {
	for _, v := range partialValues {
		s := Compile(v, "second-value-0123456789abcdef")
		for _, c := range partialCases(t, v) {
			if strings.Contains(c.body, v) {
				continue // v has none of the characters this encoder escapes
			}
			t.Run(v[:8]+"/"+c.name, func(t *testing.T) {
				out, n := s.String(c.body)
				if n == 0 {
					t.Fatalf("not masked: %q", c.body)
				}
				assertMasked(t, c.body, out, c.at, c.n)
				if want, wn := refMask(s, []byte(c.body)); string(want) != out || wn != n {
					t.Fatalf("reference: %q (%d), Set.String: %q (%d)", want, wn, out, n)
				}
				for i := 0; i <= len(c.body); i++ {
					got, n := streamMask(t, s, splitAt([]byte(c.body), i))
					if string(got) != out || n == 0 {
						t.Fatalf("split at %d: %q (%d), want %q", i, got, n, out)
					}
				}
				got, err := io.ReadAll(s.Reader(iotest.OneByteReader(strings.NewReader(c.body))))
				if err != nil || string(got) != out {
					t.Fatalf("one byte reads: %q, %v", got, err)
				}
			})
		}
	}
}

// TestPartialEscapesNotOthers: a spelling of another value, or of the
// value with one character changed, is left alone.
func TestPartialEscapesNotOthers(t *testing.T) {
	v := partialValues[0]
	s := Compile(v)
	for _, body := range []string{
		strings.Replace(v, "+", "&#44;", 1),  // ','
		strings.Replace(v, "+", "%2C", 1),    // ','
		strings.Replace(v, "/", `\u002e`, 1), // '.'
		strings.Replace(v, "==", "&#61;", 1), // one '=' short
		strings.Replace(v, "Q/t", "Q%2F%2Ft", 1),
	} {
		if out, n := s.String(body); n != 0 {
			t.Errorf("%q masked as %q", body, out)
		}
	}
}

// TestPartialEscapesHoldBack: a Reader holds back a partial spelling (the
// escape sequences make it longer than the value) until it is complete or
// broken, and releases the bytes before it at once: cut inside the last
// entity, or two bytes into a spelling that begins with an escape.
func TestPartialEscapesHoldBack(t *testing.T) {
	v, w := partialValues[0], "+Q2eRtY/uIop9As+dF"
	for _, c := range []struct {
		v, spelled string
		cut        int
	}{
		{v, strings.ReplaceAll(strings.ReplaceAll(v, "=", "&#x0003D;"), "+", "&#0043;"), -3},
		{w, strings.ReplaceAll(w, "+", "&#43;"), 2},
		{w, strings.ReplaceAll(w, "+", "%2b"), 2},
	} {
		s := Compile(c.v)
		cut := (c.cut + len(c.spelled)) % len(c.spelled)
		r := s.Reader(&chunks{parts: [][]byte{[]byte("head " + c.spelled[:cut]), []byte(c.spelled[cut:] + " tail")}})
		buf := make([]byte, 1<<10)
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != "head " {
			t.Fatalf("%q cut at %d: first read %q, %v; want only what precedes the spelling", c.spelled, cut, buf[:n], err)
		}
		rest, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Repeat("*", len(c.spelled)) + " tail"; string(rest) != want {
			t.Fatalf("got %q, want %q", rest, want)
		}
		if s.MaxLen() < len(c.spelled) {
			t.Fatalf("MaxLen %d below a %d-byte spelling", s.MaxLen(), len(c.spelled))
		}
	}
}

// TestFlexShortRunKeepsStep: a value whose longest run is short (a Basic
// pair's "deploy", a bearer token's "uIop9As") is anchored on longer
// extensions of the run, so the prefilter samples as sparsely as for
// values matched in their whole-value forms only (whose shortest form, the
// raw value, may set a shorter step still).
func TestFlexShortRunKeepsStep(t *testing.T) {
	for _, v := range append(slices.Clone(benchValues), partialValues...) {
		s := Compile(v)
		want := min(flexAnchorLen, s.minLen) - gramLen + 1
		switch pre := s.parts[0].pre; {
		case pre == nil:
			t.Errorf("%.12s...: no prefilter", v)
		case pre.step < want:
			t.Errorf("%.12s...: prefilter step %d, want at least %d", v, pre.step, want)
		}
	}
}
