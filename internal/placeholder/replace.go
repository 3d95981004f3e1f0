package placeholder

import (
	"bytes"
	"context"
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
	"github.com/egressd/egressd/internal/scrub"
)

// MaxBody is the largest request body of known length that is read whole before it is
// forwarded: searched (and replaced in, with its Content-Length recomputed) before
// anything reaches the upstream. Longer bodies, and bodies of unknown length (chunked,
// HTTP/2 streams), are searched as they stream (stream.go).
const MaxBody = 1 << 20

// Locations a credential cannot name: a placeholder there is always refused.
const (
	LocationMethod     = "method"
	LocationPath       = "path"
	LocationHeaderName = "header_name"
	LocationTrailer    = "trailer"
	LocationWebSocket  = "websocket"
	LocationUpgrade    = "upgrade"
)

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
	what := "a credential placeholder"
	if e.ID != "" {
		what = "a placeholder of credential " + e.ID
	}
	return what + " in the " + e.Location + " of a request to " + e.Host +
		", outside its trusted domains or injection locations"
}

// ErrPlaintext is a placeholder that would be replaced in a plain-HTTP request whose rule
// does not set allow_plaintext: refused with plaintext_credential, like any credential.
var ErrPlaintext = errors.New("a credential placeholder would be replaced in a plain-HTTP request")

// Replacer finds and replaces the placeholders of one policy's credentials.
type Replacer struct {
	creds Credentials
	byPH  map[string]string  // placeholder -> credential ID
	phs   []string           // the placeholders, sorted
	lower []string           // phs lower-cased, for header names
	m     *matcher           // over phs
	env   map[string]string  // the policy's env section: NAME -> placeholder
	aws   map[string]AWSPair // aws credential ID -> its placeholder key pair (aws.go)
	ids   []string           // every credential with a placeholder, sorted
	// values is what Scrub masks (scrub.go); mu serialises its updates.
	values atomic.Pointer[valueSet]
	mu     sync.Mutex
	// phSet masks the placeholders themselves in every form, for a WebSocket's
	// frames (upgrade.go); compiled at first use, since few policies need it.
	phSet func() *scrub.Set
}

// New derives the placeholders of ids (every credential the policy names, in its env
// section or its entries) and of the env section's variables (NAME -> credential ID).
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY name an aws credential: they get its
// placeholder key pair, which is signed with rather than replaced.
func New(key []byte, env string, vars map[string]string, ids []string, creds Credentials) *Replacer {
	r := &Replacer{creds: creds, byPH: map[string]string{}, env: map[string]string{}, aws: map[string]AWSPair{}}
	for _, id := range ids {
		r.add(Derive(key, env, id), id)
	}
	for name, id := range vars {
		if IsAWSVar(name) {
			r.aws[id] = DeriveAWS(key, env, id)
			r.env[name] = r.aws[id].envValue(name)
			continue
		}
		ph := Derive(key, env, id)
		r.add(ph, id)
		r.env[name] = ph
	}
	slices.Sort(r.phs)
	slices.Sort(r.ids)
	for _, ph := range r.phs {
		r.lower = append(r.lower, strings.ToLower(ph))
	}
	r.m = newMatcher(r.phs)
	r.phSet = sync.OnceValue(func() *scrub.Set { return scrub.Compile(r.phs...) })
	return r
}

func (r *Replacer) add(ph, id string) {
	if _, ok := r.byPH[ph]; !ok {
		r.byPH[ph] = id
		r.phs = append(r.phs, ph)
		r.ids = append(r.ids, id)
	}
}

// Active reports whether there are placeholders to look for.
func (r *Replacer) Active() bool { return r != nil && len(r.phs) > 0 }

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

// Vars returns the policy's env section as the Replacer holds it: NAME -> credential ID.
func (r *Replacer) Vars() map[string]string {
	out := map[string]string{}
	if r == nil {
		return out
	}
	for name, ph := range r.env {
		out[name] = r.byPH[ph]
	}
	return out
}

// Await waits, at most credential.FirstReadWait, for the first read of every
// credential with a placeholder while it is still in flight after a start (when the
// Credentials can wait: inject.Awaiter), so that whether a host is a trusted domain
// (Intercepts) is known before its tunnel is spliced or intercepted. It returns at once
// once they have been read.
func (r *Replacer) Await(ctx context.Context) {
	if r == nil {
		return
	}
	a, ok := r.creds.(interface {
		Await(ctx context.Context, id string)
	})
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, credential.FirstReadWait)
	defer cancel()
	for _, id := range r.ids {
		a.Await(ctx, id)
	}
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
// the Replacer's Scrub Set from then on; for a streamed body, every credential the
// body may carry, since the response's scrubbing is settled before the body has been
// read.
type Result struct {
	IDs  []string
	body *bodyStream // the streamed body, when there is one
}

// Refused returns the error a streamed body was ended with (a placeholder out of
// scope in it or in its trailers, ErrSplit, ErrPlaintext, an unavailable credential),
// or nil. The request was then aborted: the upstream got a truncated body, never the
// placeholder.
func (res Result) Refused() error {
	if res.body == nil {
		return nil
	}
	return res.body.refused()
}

// add records that id's value val is placed by this request: its ID for the log,
// its value for Scrub before the request goes out.
func (s *scope) add(id, val string) {
	if !slices.Contains(s.res.IDs, id) {
		s.res.IDs = append(s.res.IDs, id)
		s.r.note(id, val)
	}
}

// Apply replaces every placeholder in out's header values (inside Basic credentials too),
// query and body with its credential's value, where the credential allows that location
// for host (its trusted domains; without any, a host whose winning rule names it). A
// placeholder anywhere else (those locations otherwise, the method, the path, a header or trailer
// name, a trailer value) is a *ScopeError; a credential that cannot be served its
// *credential.UnavailableError; over plain HTTP (plaintext) a replacement the rule does
// not allow_plaintext is ErrPlaintext. On an error out must not be forwarded. A body
// longer than MaxBody or of unknown length is searched as it streams: out.Body then
// ends with such an error instead (Result.Refused), which aborts the request.
func (r *Replacer) Apply(out *http.Request, host string, rule *allowlist.Rule, plaintext bool) (Result, error) {
	if !r.Active() {
		return Result{}, nil
	}
	s := &scope{r: r, host: host, rule: rule, plaintext: plaintext}
	for _, step := range []func(*http.Request) error{s.method, s.path, s.headers, s.query, s.trailerNames, s.body} {
		if err := step(out); err != nil {
			return Result{}, err
		}
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
		s.add(id, val)
	}
	return str, nil
}

// refuse returns the *ScopeError of a placeholder in str, where loc is never a
// location a credential names; fold compares regardless of case (a field name is
// re-cased on its way).
func (s *scope) refuse(str, loc string, fold bool) error {
	phs := s.r.phs
	switch {
	case fold && !containsFold(str, Prefix):
		return nil
	case fold:
		str, phs = strings.ToLower(str), s.r.lower
	case !strings.Contains(str, Prefix):
		return nil
	}
	for i, ph := range phs {
		if strings.Contains(str, ph) {
			return &ScopeError{ID: s.r.byPH[s.r.phs[i]], Host: s.host, Location: loc}
		}
	}
	return nil
}

// containsFold reports whether s holds sub (ASCII) in any case, without allocating.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// method refuses a placeholder in the request method, which a client may spell as
// any token and an upstream may store or echo.
func (s *scope) method(out *http.Request) error {
	return s.refuse(out.Method, LocationMethod, true)
}

// path refuses a placeholder in the path, as sent or percent-decoded (any case).
func (s *scope) path(out *http.Request) error {
	u := out.URL
	for _, p := range []string{u.Path, u.RawPath, u.Opaque} {
		if err := s.refuse(p, LocationPath, false); err != nil {
			return err
		}
		if dec, err := url.PathUnescape(p); err == nil && dec != p {
			if err := s.refuse(dec, LocationPath, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// trailerNames refuses a placeholder in a declared trailer name (values arrive with
// the end of the body: trailers).
func (s *scope) trailerNames(out *http.Request) error {
	for k := range out.Trailer {
		if err := s.refuse(k, LocationTrailer, true); err != nil {
			return err
		}
	}
	return nil
}

// trailers refuses a placeholder in a trailer's name or value.
func (s *scope) trailers(h http.Header) error {
	for k, vs := range h {
		if err := s.refuse(k, LocationTrailer, true); err != nil {
			return err
		}
		for _, v := range vs {
			if err := s.refuse(v, LocationTrailer, false); err != nil {
				return err
			}
		}
	}
	return nil
}

func raw(v string) string { return v }

// headers refuses a placeholder in a header name, and replaces in every header value,
// and inside "Basic" credentials.
func (s *scope) headers(out *http.Request) error {
	for k, vs := range out.Header {
		if err := s.refuse(k, LocationHeaderName, true); err != nil {
			return err
		}
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
func (s *scope) query(out *http.Request) error {
	u := out.URL
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

// body searches the body: one of known length up to MaxBody is read and replaced in
// now, with its new Content-Length; any other streams (stream.go), chunked (or without
// a Content-Length on HTTP/2) when a placeholder in it may be replaced. Inside JSON a
// value goes in JSON-escaped, inside a form form-escaped, raw elsewhere.
func (s *scope) body(out *http.Request) error {
	if out.Body == nil || out.Body == http.NoBody {
		return nil
	}
	b := s.bodyStream(out)
	if out.ContentLength > 0 && out.ContentLength <= MaxBody {
		return s.buffered(out, b)
	}
	b.src, b.closer = out.Body, out.Body
	out.Body, out.GetBody = b, nil
	s.res.body = b
	for k := range s.r.phs {
		if v := b.verdictOf(k); v.err == nil {
			s.add(s.r.byPH[s.r.phs[k]], v.value)
			out.ContentLength = -1 // the length is known once the body has streamed
		}
	}
	return nil
}

// bodyStream returns the body's search: what each placeholder becomes in the body of
// a request to the host, and the trailer check.
func (s *scope) bodyStream(out *http.Request) *bodyStream {
	esc := escaper(out.Header.Get("Content-Type"))
	judge := func(k int) verdict {
		val, err := s.allowed(s.r.byPH[s.r.phs[k]], credential.LocationBody)
		if err != nil {
			return verdict{err: err}
		}
		return verdict{inserted: esc(val), value: val}
	}
	return newBodyStream(s.r.m, judge, func() error { return s.trailers(out.Trailer) })
}

// buffered reads the body (known to be at most MaxBody), replaces in it, and refuses it
// before anything is forwarded. A body that ended in a read error goes on searched as
// far as it came, and fails in the transport as it would have.
func (s *scope) buffered(out *http.Request, b *bodyStream) error {
	orig := out.Body
	buf, rerr := readBody(orig, out.ContentLength)
	nb, err := b.all(buf, rerr == nil)
	if err != nil {
		return err
	}
	for k, used := range b.used {
		if used {
			s.add(s.r.byPH[s.r.phs[k]], b.verdictOf(k).value)
		}
	}
	var r io.Reader = bytes.NewReader(nb)
	if rerr != nil {
		r = io.MultiReader(r, errReader{rerr})
	}
	out.Body = bodyOf(r, orig)
	out.GetBody = nil
	if rerr == nil {
		out.ContentLength = int64(len(nb))
	}
	return nil
}

// readBody reads a body of length at most MaxBody, in one allocation.
func readBody(r io.Reader, length int64) ([]byte, error) {
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

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
