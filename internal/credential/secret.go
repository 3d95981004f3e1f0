package credential

import (
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
)

// expectedShapes ends every shape error: the fix is in the message.
const expectedShapes = `(expected {"token": ...}, {"headers": {...}} or {"username": ..., "password": ...})`

// secretError is a bad secret shape. It names the credential ID and, where one is
// involved, a key or header name; it never holds a value.
type secretError struct {
	id, what string
	hint     bool // append expectedShapes
}

func (e *secretError) Error() string {
	msg := "credential " + e.id + ": " + e.what
	if e.hint {
		msg += " " + expectedShapes
	}
	return msg
}

func (e *secretError) Is(target error) bool { return target == ErrInvalid }

func shapeErr(id, what string) error { return &secretError{id: id, what: what, hint: true} }
func valueErr(id, what string) error { return &secretError{id: id, what: what} }

// ParseSecret turns a secret of one of the three shapes of docs/policy.md into the headers it sets:
//
//	{"token": "t"}                        Authorization: Bearer t
//	{"headers": {"x-api-key": "k"}}       X-Api-Key: k (names canonicalised, sorted)
//	{"username": "u", "password": "p"}    Authorization: Basic base64(u:p)
//
// A nil raw means the secret was not a JSON object. Errors wrap ErrInvalid and name the ID
// and at most a key or header name, never a value.
func ParseSecret(id string, raw map[string]any) ([]Header, error) {
	if raw == nil {
		return nil, shapeErr(id, "secret is not a JSON object")
	}
	if len(raw) == 0 {
		return nil, shapeErr(id, "secret is empty")
	}
	var unknown []string
	for k := range raw {
		switch k {
		case "token", "headers", "username", "password":
		default:
			unknown = append(unknown, quoteName(k))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, shapeErr(id, "unknown key "+strings.Join(unknown, ", "))
	}
	_, token := raw["token"]
	_, headers := raw["headers"]
	_, user := raw["username"]
	_, pass := raw["password"]
	switch {
	case token && headers:
		return nil, shapeErr(id, `both "token" and "headers"`)
	case (token || headers) && (user || pass):
		return nil, shapeErr(id, `"username"/"password" mixed with "token" or "headers"`)
	case token:
		return parseToken(id, raw["token"])
	case headers:
		return parseHeaders(id, raw["headers"])
	default:
		return parseBasic(id, raw, user, pass)
	}
}

func parseToken(id string, v any) ([]Header, error) {
	tok, ok := v.(string)
	switch {
	case !ok:
		return nil, shapeErr(id, `"token" is not a string`)
	case tok == "":
		return nil, shapeErr(id, "empty token")
	case len(tok) >= 7 && strings.EqualFold(tok[:7], "bearer "):
		return nil, valueErr(id, `token starts with "Bearer ": give the bare token, egressd adds the scheme`)
	case isPEMBlock(tok):
		// Key material (egressd's hook signing key) keeps its line breaks: it is read with
		// Value.Token, never meant as a header. Were an allowlist entry to name it anyway,
		// the proxy refuses a header value with a line break before sending anything (net/http's
		// Transport, and internal/proxy's validHeader on its own upstream pool), so the
		// request fails; it can never split a header.
		return []Header{{Name: "Authorization", Value: "Bearer " + tok}}, nil
	}
	if what := checkValue(tok); what != "" {
		return nil, valueErr(id, "token "+what)
	}
	return []Header{{Name: "Authorization", Value: "Bearer " + tok}}, nil
}

func parseHeaders(id string, v any) ([]Header, error) {
	m, ok := v.(map[string]any)
	switch {
	case !ok:
		return nil, shapeErr(id, `"headers" is not an object`)
	case len(m) == 0:
		return nil, shapeErr(id, `"headers" is empty`)
	}
	out := make([]Header, 0, len(m))
	for name, val := range m {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case !validName(name):
			return nil, valueErr(id, "header "+quoteName(name)+": invalid header name")
		case allowlist.ReservedHeader(canon) != "":
			return nil, valueErr(id, "header "+quoteName(canon)+": cannot be injected (hop-by-hop, framing or Egressd-* header)")
		}
		s, ok := val.(string)
		if !ok {
			return nil, valueErr(id, "header "+quoteName(canon)+": value is not a string")
		}
		if what := checkValue(s); what != "" {
			return nil, valueErr(id, "header "+quoteName(canon)+": value "+what)
		}
		out = append(out, Header{Name: canon, Value: s})
	}
	slices.SortFunc(out, func(a, b Header) int { return strings.Compare(a.Name, b.Name) })
	for i := 1; i < len(out); i++ {
		if out[i].Name == out[i-1].Name {
			return nil, valueErr(id, "header "+quoteName(out[i].Name)+" given twice (names are case-insensitive)")
		}
	}
	return out, nil
}

func parseBasic(id string, raw map[string]any, hasUser, hasPass bool) ([]Header, error) {
	if !hasUser || !hasPass {
		return nil, shapeErr(id, `"username" and "password" go together`)
	}
	user, ok1 := raw["username"].(string)
	pass, ok2 := raw["password"].(string)
	switch {
	case !ok1 || !ok2:
		return nil, shapeErr(id, `"username" and "password" must be strings`)
	case user == "":
		return nil, shapeErr(id, "empty username")
	case strings.Contains(user, ":"):
		return nil, valueErr(id, `username contains ":" (not allowed in HTTP Basic, RFC 7617)`)
	case hasControl(user) || hasControl(pass):
		return nil, valueErr(id, "username or password contains a control character (CR, LF, NUL ...)")
	}
	// An empty password is allowed: some APIs take the key as the username (user:).
	enc := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return []Header{{Name: "Authorization", Value: "Basic " + enc}}, nil
}

// isPEMBlock reports whether tok is exactly one PEM block ("-----BEGIN ..." first, nothing but
// white space after its END line) whose only control characters are line breaks.
func isPEMBlock(tok string) bool {
	if !strings.HasPrefix(tok, "-----BEGIN ") || strings.ContainsFunc(tok, func(r rune) bool {
		return (r < 0x20 && r != '\n' && r != '\r') || r == 0x7f
	}) {
		return false
	}
	block, rest := pem.Decode([]byte(tok))
	return block != nil && strings.TrimSpace(string(rest)) == ""
}

// checkValue returns what is wrong with a header value (never the value), or "".
func checkValue(s string) string {
	switch {
	case s == "":
		return "is empty"
	case hasControl(s):
		return "contains a control character (CR, LF, NUL ...)"
	case s[0] == ' ' || s[0] == '\t' || s[len(s)-1] == ' ' || s[len(s)-1] == '\t':
		return "has leading or trailing whitespace"
	}
	return ""
}

// hasControl reports whether s holds a byte that may not appear in a header field value
// (RFC 9110 5.5): a control character other than horizontal tab, or DEL.
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return true
		}
	}
	return false
}

// validName reports whether s is an RFC 9110 token (a valid field name).
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// quoteName quotes a key or header name for an error, escaping control characters.
// Names are not secret, but a misplaced secret could sit where a name goes: a name too
// long to be a plausible header or key is described, not shown.
func quoteName(s string) string {
	const max = 64
	if len(s) > max {
		return "(a name of " + strconv.Itoa(len(s)) + " bytes, not shown)"
	}
	return strconv.Quote(s)
}
