package scrub

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"html"
	"html/template"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode/utf16"

	"golang.org/x/text/encoding/unicode"
)

// Test values: a token with base64 and URL specials, one with JSON and
// HTML specials and a space, one with non-ASCII (two- to four-byte UTF-8).
var testValues = []string{
	"sk-live-0123456789abcdefXYZ/+=",
	`p<a>s&s"w\o/rd 1`,
	"pässwörd-ünï€-𝄞x",
	// Long enough for MIME base64 to break its lines (over 57 bytes).
	"ghp_MIMEwrapped0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN/+=_-0123456789",
}

// placed is a body with an encoded value at [at, at+n).
type placed struct {
	name string
	body string
	at   int
	n    int
}

// place builds a case: enc(v) between fixed text.
func place(name, enc string) placed {
	const pre, post = "<<prefix text ", " suffix>>"
	return placed{name: name, body: pre + enc + post, at: len(pre), n: len(enc)}
}

// encodedCases renders v with the encoders the sandbox would meet: the
// standard library's where it has one, an independent rendering otherwise.
func encodedCases(v string) []placed {
	js, _ := json.Marshal(v)
	var noHTML bytes.Buffer
	e := json.NewEncoder(&noHTML)
	e.SetEscapeHTML(false)
	_ = e.Encode(v)
	jsonRaw := strings.Trim(strings.TrimSpace(noHTML.String()), `"`)
	cases := []placed{
		place("raw", v),
		place("base64 std", base64.StdEncoding.EncodeToString([]byte(v))),
		place("base64 std unpadded", base64.RawStdEncoding.EncodeToString([]byte(v))),
		place("base64 url", base64.URLEncoding.EncodeToString([]byte(v))),
		place("base64 url unpadded", base64.RawURLEncoding.EncodeToString([]byte(v))),
		place("query escape", url.QueryEscape(v)),
		place("query escape lower", pctHex.ReplaceAllStringFunc(url.QueryEscape(v), strings.ToLower)),
		place("path escape", url.PathEscape(v)),
		place("url values", strings.TrimPrefix(url.Values{"k": {v}}.Encode(), "k=")),
		place("every byte upper", everyByte(v, "%%%02X")),
		place("every byte lower", everyByte(v, "%%%02x")),
		place("spaced hex (S3's CanonicalRequestBytes)", strings.TrimSpace(everyByte(v, "%02x "))),
		place("spaced hex upper", strings.TrimSpace(everyByte(v, "%02X "))),
		place("json.Marshal", strings.Trim(string(js), `"`)),
		place("json no HTML escape", jsonRaw),
		place("json slash escaped", strings.ReplaceAll(jsonRaw, "/", `\/`)),
		place("json upper \\u", uEsc.ReplaceAllStringFunc(strings.Trim(string(js), `"`), func(e string) string { return `\u` + strings.ToUpper(e[2:]) })),
		place("json ensure_ascii", ensureASCII(jsonRaw)),
		place("html.EscapeString", html.EscapeString(v)),
		place("html/template", template.HTMLEscapeString(v)),
		place("html named", strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;").Replace(v)),
		place("hex lower", hex.EncodeToString([]byte(v))),
		place("hex upper", fmt.Sprintf("%X", v)),
		place("upper case", strings.ToUpper(v)),
		place("lower case", strings.ToLower(v)),
		place("base32", base32.StdEncoding.EncodeToString([]byte(v))),
		place("base32 unpadded", base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(v))),
		place("utf-16le", utf16With(v, unicode.LittleEndian)),
		place("utf-16be", utf16With(v, unicode.BigEndian)),
		place("json every char lower", everyRune(v, `\u%04x`)),
		place("json every char upper", everyRune(v, `\u%04X`)),
		place("pem (mime 64, LF)", pemBody(v)),
		place("mime 76 CRLF", wrapLines(base64.StdEncoding.EncodeToString([]byte(v)), 76, "\r\n")),
		place("mime 76 LF", wrapLines(base64.StdEncoding.EncodeToString([]byte(v)), 76, "\n")),
		place("mime 64 CRLF", wrapLines(base64.StdEncoding.EncodeToString([]byte(v)), 64, "\r\n")),
	}
	return cases
}

// utf16With encodes v with x/text's UTF-16 encoder, no byte order mark.
func utf16With(v string, e unicode.Endianness) string {
	out, err := unicode.UTF16(e, unicode.IgnoreBOM).NewEncoder().String(v)
	if err != nil {
		panic(err)
	}
	return out
}

// everyRune writes every UTF-16 unit of v with format.
func everyRune(v, format string) string {
	var b strings.Builder
	for _, u := range utf16.Encode([]rune(v)) {
		fmt.Fprintf(&b, format, u)
	}
	return b.String()
}

// pemBody is encoding/pem's base64 of v: 64 columns, LF, without the
// armour and the last line break.
func pemBody(v string) string {
	p := string(pem.EncodeToMemory(&pem.Block{Type: "X", Bytes: []byte(v)}))
	p = strings.TrimPrefix(p, "-----BEGIN X-----\n")
	return strings.TrimSuffix(p, "\n-----END X-----\n")
}

// wrapLines breaks s into lines of w characters joined by sep.
func wrapLines(s string, w int, sep string) string {
	var b strings.Builder
	for i := 0; i < len(s); i += w {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s[i:min(len(s), i+w)])
	}
	return b.String()
}

var (
	pctHex = regexp.MustCompile(`%[0-9A-F]{2}`)
	uEsc   = regexp.MustCompile(`\\u[0-9a-f]{4}`)
)

// everyByte formats each byte of v with format.
func everyByte(v, format string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		fmt.Fprintf(&b, format, v[i])
	}
	return b.String()
}

// ensureASCII is Python's json.dumps(ensure_ascii=True) applied to an
// already-escaped JSON string body: non-ASCII runes as UTF-16 \uXXXX.
func ensureASCII(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x80 {
			b.WriteRune(r)
			continue
		}
		for _, u := range utf16.Encode([]rune{r}) {
			fmt.Fprintf(&b, `\u%04x`, u)
		}
	}
	return b.String()
}

// assertMasked checks out against body: same length, [at, at+n) all masks,
// everything before and after untouched.
func assertMasked(t *testing.T, body, out string, at, n int) {
	t.Helper()
	if len(out) != len(body) {
		t.Fatalf("length %d, want %d", len(out), len(body))
	}
	if want := strings.Repeat("*", n); out[at:at+n] != want {
		t.Errorf("region not masked: %q", out[at:at+n])
	}
	if out[:at] != body[:at] || out[at+n:] != body[at+n:] {
		t.Errorf("text around the value changed: %q", out)
	}
}

func TestFormsMaskedInPlace(t *testing.T) {
	for _, v := range testValues {
		s := Compile(v)
		for _, c := range encodedCases(v) {
			t.Run(c.name, func(t *testing.T) {
				out, n := s.String(c.body)
				if n == 0 {
					t.Fatalf("no replacement in %q", c.body)
				}
				assertMasked(t, c.body, out, c.at, c.n)
			})
		}
	}
}

// TestBase64Embedded puts v at every offset modulo 3 inside a longer base64
// string (a token inside base64'd JSON) and checks that every character
// whose bits all come from v is masked.
func TestBase64Embedded(t *testing.T) {
	for _, v := range testValues {
		s := Compile(v)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			for pre := 0; pre < 6; pre++ {
				for post := 0; post < 4; post++ {
					payload := strings.Repeat("{", pre) + v + strings.Repeat("}", post)
					body := enc.EncodeToString([]byte(payload))
					from, to := (8*pre+5)/6, (8*(pre+len(v)))/6
					out, _ := s.String(body)
					if got := out[from:to]; got != strings.Repeat("*", to-from) {
						t.Errorf("pre %d post %d: core not masked: %q in %q", pre, post, got, out)
					}
				}
			}
		}
	}
}

func TestDerivedValues(t *testing.T) {
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice-the-user:correct-horse-battery"))
	cases := []struct {
		name, value, body, secret string
	}{
		{"bearer token alone", "Bearer tok_0123456789abcdef", `{"echo":"tok_0123456789abcdef"}`, "tok_0123456789abcdef"},
		{"bearer token base64", "Bearer tok_0123456789abcdef", base64.StdEncoding.EncodeToString([]byte("tok_0123456789abcdef")), ""},
		{"basic user:password", basic, "creds=alice-the-user:correct-horse-battery;", "alice-the-user:correct-horse-battery"},
		{"basic password", basic, `{"password":"correct-horse-battery"}`, "correct-horse-battery"},
		{"basic password in query", basic, "?p=" + url.QueryEscape("correct-horse-battery"), "correct-horse-battery"},
		{"basic header echoed", basic, "Authorization: " + basic + "\r\n", basic},
		{"basic token alone", basic, "X: " + strings.TrimPrefix(basic, "Basic ") + "\r\n", strings.TrimPrefix(basic, "Basic ")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Compile(c.value)
			out, n := s.String(c.body)
			if n == 0 || out == c.body {
				t.Fatalf("nothing masked in %q", c.body)
			}
			if c.secret != "" {
				i := strings.Index(c.body, c.secret)
				assertMasked(t, c.body, out, i, len(c.secret))
			}
		})
	}
}

func TestMinLen(t *testing.T) {
	short := "Basic " + base64.StdEncoding.EncodeToString([]byte("bob:pw"))
	s := Compile("1234567", "", short)
	if s.Skipped() != 4 { // "1234567", "", "bob:pw", "pw"
		t.Errorf("Skipped = %d, want 4", s.Skipped())
	}
	if out, n := s.String("pin 1234567 bob:pw"); n != 0 || out != "pin 1234567 bob:pw" {
		t.Errorf("short values masked: %q %d", out, n)
	}
	// The full Basic value is long enough, so it and its token still are.
	if _, n := s.String(short); n == 0 {
		t.Error("the Basic value itself was not masked")
	}
	if Compile().Active() || Compile("short").Active() || (*Set)(nil).Active() {
		t.Error("a Set without scrubbable values reports Active")
	}
	var nilSet *Set
	if out, n := nilSet.String("anything"); out != "anything" || n != 0 {
		t.Error("a nil Set changed a value")
	}
}

func TestOverlappingOccurrencesAllMasked(t *testing.T) {
	s := Compile("xyzab-secret", "secret-cde42")
	body := "[xyzab-secret-cde42]"
	out, n := s.String(body)
	if out != "["+strings.Repeat("*", len(body)-2)+"]" || n != 2 {
		t.Errorf("got %q, %d", out, n)
	}
}

func TestNoInjectionPassesByteForByte(t *testing.T) {
	body := textBody(1<<16, 7)
	s := Compile(testValues...)
	out, n := streamMask(t, s, [][]byte{body})
	if n != 0 || !bytes.Equal(out, body) {
		t.Fatalf("a body without secrets changed (%d replacements)", n)
	}
	out, _ = streamMask(t, Compile(), [][]byte{body})
	if !bytes.Equal(out, body) {
		t.Fatal("an inactive Set changed a body")
	}
}

func TestSetRedacts(t *testing.T) {
	v := testValues[0]
	s := Compile(v)
	js, _ := json.Marshal(map[string]any{"set": s})
	for _, out := range []string{
		fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s %q %x", s, s, s, s, s, s), s.GoString(), string(js), s.Redacted(),
	} {
		if strings.Contains(out, "sk-live") || strings.Contains(out, "c2stbGl2") || !strings.Contains(out, "redacted") {
			t.Errorf("rendering leaks or does not redact: %s", out)
		}
	}
}

// TestLongValue: a 2 KB bearer JWT compiles to a small DFA (anchors, not
// whole forms) and every form is still masked whole, streamed in pieces too.
func TestLongValue(t *testing.T) {
	tok := "eyJ" + strings.Repeat("abcDEF123_-", 2000/11)
	s := Compile("Bearer " + tok)
	if n := s.parts[0].ac.StateCount(); n > 2000 {
		t.Errorf("%d DFA states for a 2 KB value", n)
	}
	for _, c := range encodedCases(tok) {
		out, n := s.String(c.body)
		if n == 0 {
			t.Fatalf("%s: not masked", c.name)
		}
		assertMasked(t, c.body, out, c.at, c.n)
	}
	body := []byte("echo " + tok + " and " + hex.EncodeToString([]byte(tok)) + " end")
	want, wantN := refMask(s, body)
	for i := 0; i <= len(body); i += 97 {
		got, n := streamMask(t, s, splitAt(body, i, min(len(body), i+1500)))
		if !bytes.Equal(got, want) || n != wantN {
			t.Fatalf("split %d: %d replacements, want %d", i, n, wantN)
		}
	}
}

// TestJoin: a joined Set masks the values of every part, in strings and in
// a stream split at every offset (what a later read may complete is held
// back for every part, not the first only); a value in two parts is one
// occurrence; a join of one active Set is that Set.
func TestJoin(t *testing.T) {
	env, rule := Compile(testValues[0], testValues[2]), Compile(testValues[1], testValues[0])
	j := Join(env, nil, rule)
	if j.Patterns() != env.Patterns()+rule.Patterns() || Join(nil, rule, Compile()) != rule || Join(nil).Active() {
		t.Fatalf("join: %d patterns", j.Patterns())
	}
	body := []byte("a " + testValues[0] + " b " + base64.StdEncoding.EncodeToString([]byte(testValues[1])) +
		" c " + hex.EncodeToString([]byte(testValues[2])) + " d")
	want, wantN := refMask(j, body)
	if wantN < 3 {
		t.Fatalf("the reference found %d occurrences", wantN)
	}
	got := bytes.Clone(body)
	if n := j.Bytes(got); n != wantN || !bytes.Equal(got, want) {
		t.Fatalf("Bytes: %d, %q", n, got)
	}
	for i := 0; i <= len(body); i++ {
		for _, s := range []*Set{j, Join(rule, env)} {
			if got, n := streamMask(t, s, splitAt(body, i)); n != wantN || !bytes.Equal(got, want) {
				t.Fatalf("split at %d: %d, %q", i, n, got)
			}
		}
	}
}
