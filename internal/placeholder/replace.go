package placeholder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// MaxBody is the largest request body that is searched for placeholders (and has them
// replaced); a larger body is forwarded as it is, unsearched. The placeholder it may
// carry is worthless outside egressd, so this bounds memory without opening a way to the
// value.
const MaxBody = 1 << 20

// Credentials resolves a credential ID from memory (the store, or the oauth2 manager).
type Credentials interface {
	Get(id string) (credential.Value, error)
}

// ScopeError is a placeholder found outside its credential's trusted domains or named
// injection locations: the request is refused with credential_scope.
type ScopeError struct {
	ID, Host, Location string
}

func (e *ScopeError) Error() string {
	return "a placeholder of credential " + e.ID + " in the " + e.Location + " of a request to " + e.Host +
		", outside its trusted domains or injection locations"
}

// ErrPlaintext is a placeholder that would be replaced in a plain-HTTP request whose rule
// does not set allow_plaintext: refused with plaintext_credential, like any credential.
var ErrPlaintext = errors.New("a credential placeholder would be replaced in a plain-HTTP request")

// Replacer finds and replaces the placeholders of one policy's credentials.
type Replacer struct {
	creds Credentials
	byPH  map[string]string // placeholder -> credential ID
	phs   []string          // the placeholders, sorted
	env   map[string]string // the policy's env section: NAME -> placeholder
	ids   []string          // every credential with a placeholder, sorted
	// values is what Scrub masks (scrub.go); mu serialises its updates.
	values atomic.Pointer[valueSet]
	mu     sync.Mutex
}

// New derives the placeholders of ids (every credential the policy names, in its env
// section or its entries) and of the env section's variables (NAME -> credential ID).
func New(key []byte, env string, vars map[string]string, ids []string, creds Credentials) *Replacer {
	r := &Replacer{creds: creds, byPH: map[string]string{}, env: map[string]string{}}
	for _, id := range ids {
		r.add(Derive(key, env, id), id)
	}
	for name, id := range vars {
		ph := Derive(key, env, id)
		r.add(ph, id)
		r.env[name] = ph
	}
	slices.Sort(r.phs)
	slices.Sort(r.ids)
	return r
}

func (r *Replacer) add(ph, id string) {
	if _, ok := r.byPH[ph]; !ok {
		r.byPH[ph] = id
		r.phs = append(r.phs, ph)
		r.ids = append(r.ids, id)
	}
}

// Env returns the sandbox's variables: NAME -> placeholder.
func (r *Replacer) Env() map[string]string {
	if r == nil {
		return map[string]string{}
	}
	out := make(map[string]string, len(r.env))
	for k, v := range r.env {
		out[k] = v
	}
	return out
}

// Intercepts reports whether host is a trusted domain of an environment_variable
// credential: intercept: auto terminates TLS there so that the placeholder can be replaced.
func (r *Replacer) Intercepts(host string) bool {
	if r == nil {
		return false
	}
	for _, id := range r.ids {
		if v, err := r.creds.Get(id); err == nil && v.Env != nil && v.Env.Trusts(host) {
			return true
		}
	}
	return false
}

// Result is what Apply replaced: the credential IDs. The values it placed are in
// Scrub's Set from then on.
type Result struct {
	IDs []string
}

// Apply replaces every placeholder in out's header values (inside Basic credentials too),
// query and body (at most MaxBody) with its credential's value, where the credential
// allows that location for host (its trusted domains; without any, a host whose winning
// rule names it). A placeholder anywhere else is a *ScopeError; a credential that cannot
// be served its *credential.UnavailableError; over plain HTTP (plaintext) a replacement
// the rule does not allow_plaintext is ErrPlaintext. On an error out must not be forwarded.
func (r *Replacer) Apply(out *http.Request, host string, rule *allowlist.Rule, plaintext bool) (Result, error) {
	if r == nil || len(r.phs) == 0 {
		return Result{}, nil
	}
	s := &scope{r: r, host: host, rule: rule, plaintext: plaintext}
	if err := s.headers(out.Header); err != nil {
		return Result{}, err
	}
	if err := s.query(out.URL); err != nil {
		return Result{}, err
	}
	if err := s.body(out); err != nil {
		return Result{}, err
	}
	return s.res, nil
}

// scope is one request's replacement.
type scope struct {
	r         *Replacer
	host      string
	rule      *allowlist.Rule
	plaintext bool
	res       Result
}

// allowed returns the value of id when loc of a request to the host may receive it.
func (s *scope) allowed(id, loc string) (string, error) {
	v, err := s.r.creds.Get(id)
	if err != nil {
		return "", err
	}
	e := v.Env
	ok := e != nil && e.In(loc)
	if ok && len(e.TrustedDomains) > 0 {
		ok = e.Trusts(s.host)
	} else if ok {
		ok = s.rule != nil && s.rule.Credential == id
	}
	if !ok {
		return "", &ScopeError{ID: id, Host: s.host, Location: loc}
	}
	if s.plaintext && (s.rule == nil || !s.rule.AllowPlaintext) {
		return "", ErrPlaintext
	}
	return e.Value, nil
}

// replace returns str with every placeholder replaced by esc(value).
func (s *scope) replace(str, loc string, esc func(string) string) (string, error) {
	if !strings.Contains(str, Prefix) {
		return str, nil
	}
	for _, ph := range s.r.phs {
		if !strings.Contains(str, ph) {
			continue
		}
		id := s.r.byPH[ph]
		val, err := s.allowed(id, loc)
		if err != nil {
			return "", err
		}
		str = strings.ReplaceAll(str, ph, esc(val))
		if !slices.Contains(s.res.IDs, id) {
			s.res.IDs = append(s.res.IDs, id)
			s.r.note(id, val)
		}
	}
	return str, nil
}

func raw(v string) string { return v }

// headers replaces in every header value, and inside "Basic" credentials.
func (s *scope) headers(h http.Header) error {
	for _, vs := range h {
		for i, v := range vs {
			nv, err := s.header(v)
			if err != nil {
				return err
			}
			vs[i] = nv
		}
	}
	return nil
}

func (s *scope) header(v string) (string, error) {
	if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "basic") {
		if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil && bytes.Contains(dec, []byte(Prefix)) {
			nd, err := s.replace(string(dec), credential.LocationHeader, raw)
			if err != nil {
				return "", err
			}
			return scheme + " " + base64.StdEncoding.EncodeToString([]byte(nd)), nil
		}
	}
	return s.replace(v, credential.LocationHeader, raw)
}

// query replaces in the query's keys and values, raw or percent-encoded (any case);
// a component that holds a placeholder is re-encoded with the value query-escaped.
func (s *scope) query(u *url.URL) error {
	q := u.RawQuery
	if q == "" || !strings.Contains(q, Prefix) && !strings.Contains(q, "%") {
		return nil
	}
	parts := strings.Split(q, "&")
	for i, p := range parts {
		comps := strings.SplitN(p, "=", 2)
		for j, c := range comps {
			dec, err := url.QueryUnescape(c)
			if err != nil {
				dec = c // not valid percent-encoding: searched as it is
			}
			if !strings.Contains(dec, Prefix) {
				continue
			}
			nd, err := s.replace(dec, credential.LocationQuery, raw)
			if err != nil {
				return err
			}
			if nd != dec {
				comps[j] = url.QueryEscape(nd)
			}
		}
		parts[i] = strings.Join(comps, "=")
	}
	u.RawQuery = strings.Join(parts, "&")
	return nil
}

// body replaces in a body of at most MaxBody bytes: JSON-escaped inside JSON,
// form-escaped inside a form, raw elsewhere. The framing follows: the new
// Content-Length, or chunked when the request was chunked.
func (s *scope) body(out *http.Request) error {
	if out.Body == nil || out.Body == http.NoBody {
		return nil
	}
	orig := out.Body
	buf, err := readBody(orig, out.ContentLength)
	if err != nil || len(buf) > MaxBody {
		// A read error reaches the transport as it would have; a large body goes on unsearched.
		out.Body = bodyOf(io.MultiReader(bytes.NewReader(buf), errOr(err, orig)), orig)
		return nil
	}
	if !bytes.Contains(buf, []byte(Prefix)) {
		out.Body = bodyOf(bytes.NewReader(buf), orig)
		out.GetBody = nil
		return nil
	}
	nb, err := s.replace(string(buf), credential.LocationBody, escaper(out.Header.Get("Content-Type")))
	if err != nil {
		return err
	}
	out.Body = bodyOf(strings.NewReader(nb), orig)
	out.GetBody = nil
	if !slices.Contains(out.TransferEncoding, "chunked") {
		out.ContentLength = int64(len(nb))
	}
	return nil
}

// readBody reads at most MaxBody+1 bytes of r, in one allocation when the length is known.
func readBody(r io.Reader, length int64) ([]byte, error) {
	if length <= 0 || length > MaxBody {
		return io.ReadAll(io.LimitReader(r, MaxBody+1))
	}
	buf := make([]byte, length, length+1)
	n, err := io.ReadFull(r, buf)
	if err != nil {
		return buf[:n], err
	}
	var one [1]byte
	if m, _ := r.Read(one[:]); m > 0 { // more than announced: the transport finds out
		return append(buf, one[0]), errBodyTooLong
	}
	return buf, nil
}

// errBodyTooLong: the client sent more than its Content-Length.
var errBodyTooLong = errors.New("request body longer than its Content-Length")

// escaper is how a value is inserted into a body of the content type.
func escaper(contentType string) func(string) string {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return jsonEscape
	case mt == "application/x-www-form-urlencoded":
		return url.QueryEscape
	}
	return raw
}

// jsonEscape returns v as the inside of a JSON string.
func jsonEscape(v string) string {
	b, _ := json.Marshal(v)
	return string(b[1 : len(b)-1])
}

type readCloser struct {
	io.Reader
	io.Closer
}

func bodyOf(r io.Reader, c io.Closer) io.ReadCloser { return readCloser{r, c} }

// errOr is a reader of err, or r when err is nil.
func errOr(err error, r io.Reader) io.Reader {
	if err != nil {
		return errReader{err}
	}
	return r
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
