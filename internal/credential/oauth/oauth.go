// Package oauth keeps the access tokens of oauth2 credentials. For each one it exchanges the
// refresh token (RFC 6749 §6) or, without one, the client credentials (§4.4) at token_url
// with golang.org/x/oauth2 (client authentication by HTTP Basic, falling back to the form:
// AuthStyleAutoDetect), caches the access token and refreshes it ahead of expiry (jittered,
// one refresh per credential at a time), uses a rotated refresh token from then on and
// writes it back where the backend can be written, and keeps serving the last access token
// while the endpoint fails, until it expires.
//
// Invariants: an expired access token is never handed out (Get then fails with
// credential.CauseNoAccessToken); the token call is egressd's own, through the address guard
// and never the sandbox's allowlist; no secret (client secret, refresh token, access token)
// reaches an error, a log line or a metric.
package oauth

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/egressd/egressd/internal/credential"
)

// Defaults and bounds.
const (
	// DefaultTick is how often the Manager looks for tokens due for refresh and for
	// credentials whose secret changed.
	DefaultTick = time.Second
	// DefaultLifetime is assumed for an access token whose response has no expires_in.
	DefaultLifetime = time.Hour
	// callTimeout bounds one token call.
	callTimeout = 15 * time.Second
	// refreshFrom and refreshSpread place the refresh at 75–85% of the token's lifetime.
	refreshFrom, refreshSpread = 0.75, 0.10
	// maxSkew is the most an access token's expiry is brought forward (a tenth of its
	// lifetime at most), so that one sent just before expiry still arrives valid.
	maxSkew = 5 * time.Second
	// minBackoff and maxBackoff bound the wait after a failed token call.
	minBackoff, maxBackoff = time.Second, 30 * time.Second
)

// Results of a token call: the result label of egressd_oauth_refresh_total.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// Source is the credential store the Manager reads the oauth2 clients from.
type Source interface {
	Get(id string) (credential.Value, error)
	IDs() []string
}

// Options configure a Manager; zero values take the defaults.
type Options struct {
	// Writer stores a rotated refresh token; nil: it is kept in memory only, with a WARN.
	Writer credential.Writer
	// Metrics, when set, is called after every token call with ResultOK or ResultError.
	Metrics func(id, result string)
	Log     zerolog.Logger
	Now     func() time.Time // default time.Now
	Tick    time.Duration    // default DefaultTick
}

// Manager serves credentials from a Source, with the current access token as the
// Authorization header of every oauth2 one. It is an inject.Credentials.
type Manager struct {
	src    Source
	o      Options
	client atomic.Pointer[http.Client]
	mu     sync.Mutex
	states map[string]*state
	ctx    context.Context
	wg     sync.WaitGroup
}

// state is one oauth2 credential.
type state struct {
	id   string
	busy atomic.Bool            // a refresh is running or queued (single flight)
	cur  atomic.Pointer[token]  // the last access token; nil before the first
	seen atomic.Pointer[string] // the backend version last adopted
	due  atomic.Int64           // unix nanos before which no retry starts after a failure

	mu       sync.Mutex // serialises refreshes; guards the fields below
	secret   *credential.OAuth2
	refresh  string // the refresh token in use (rotated ones included)
	wrote    string // the last refresh token written back
	conf     *oauth2.Config
	cc       *clientcredentials.Config
	failures int
}

// token is one access token, immutable.
type token struct {
	headers   []credential.Header
	expiry    time.Time // serve strictly before this (the real expiry less a skew)
	refreshAt time.Time
}

// New returns a Manager over src; Start begins its work. Until SetClient, token calls fail.
func New(src Source, o Options) *Manager {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Tick <= 0 {
		o.Tick = DefaultTick
	}
	return &Manager{src: src, o: o, states: map[string]*state{}, ctx: context.Background()}
}

// SetClient sets the HTTP client of token calls (NewClient's), e.g. after a reload.
func (m *Manager) SetClient(c *http.Client) { m.client.Store(c) }

// Start fetches a token for every oauth2 credential of the Source (bounded by the call
// timeout), then refreshes in the background until ctx ends. Call it once, after the
// Source has started.
func (m *Manager) Start(ctx context.Context) {
	m.ctx = ctx
	var wg sync.WaitGroup
	for _, id := range m.src.IDs() {
		if v, err := m.src.Get(id); err == nil && v.OAuth2 != nil {
			st := m.state(id)
			st.busy.Store(true)
			wg.Go(func() { m.run(st) })
		}
	}
	wg.Wait()
	m.wg.Go(m.loop)
}

// Wait blocks until the background work has ended (after Start's ctx ended).
func (m *Manager) Wait() { m.wg.Wait() }

// IDs are the Source's.
func (m *Manager) IDs() []string { return m.src.IDs() }

// Get returns the Source's value of id; for an oauth2 credential, with the current access
// token as its Authorization header, or an *credential.UnavailableError (cause
// no_access_token) when there is no unexpired one.
func (m *Manager) Get(id string) (credential.Value, error) {
	v, err := m.src.Get(id)
	if err != nil || v.OAuth2 == nil {
		return v, err
	}
	st := m.state(id)
	t := st.cur.Load()
	if t == nil || !m.o.Now().Before(t.expiry) {
		m.kick(st)
		return credential.Value{}, &credential.UnavailableError{ID: id, Cause: credential.CauseNoAccessToken}
	}
	v.Headers = t.headers
	return v, nil
}

func (m *Manager) state(id string) *state {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.states[id]
	if st == nil {
		st = &state{id: id}
		m.states[id] = st
	}
	return st
}

// loop looks every Tick for tokens due and secrets changed, until ctx ends.
func (m *Manager) loop() {
	t := time.NewTicker(m.o.Tick)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		for _, id := range m.src.IDs() {
			if v, err := m.src.Get(id); err == nil && v.OAuth2 != nil {
				m.check(m.state(id), v)
			}
		}
	}
}

// check starts a refresh of st when its token is missing or due, or its secret changed,
// unless a failure asked to wait.
func (m *Manager) check(st *state, v credential.Value) {
	now := m.o.Now()
	if now.UnixNano() < st.due.Load() {
		return
	}
	t, seen := st.cur.Load(), st.seen.Load()
	if t == nil || !now.Before(t.refreshAt) || seen == nil || *seen != v.Version {
		m.kick(st)
	}
}

// kick starts one refresh of st in the background unless one is running.
func (m *Manager) kick(st *state) {
	if m.ctx.Err() != nil || !st.busy.CompareAndSwap(false, true) {
		return
	}
	m.wg.Go(func() { m.run(st) })
}

// run refreshes st; busy is set by the caller and cleared here.
func (m *Manager) run(st *state) {
	defer st.busy.Store(false)
	ctx, cancel := context.WithTimeout(m.ctx, callTimeout)
	defer cancel()
	m.refresh(ctx, st)
}

// refresh makes one token call for st and stores the outcome.
func (m *Manager) refresh(ctx context.Context, st *state) {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, err := m.src.Get(st.id)
	if err != nil || v.OAuth2 == nil {
		return
	}
	st.adopt(v)
	tok, err := st.fetch(context.WithValue(ctx, oauth2.HTTPClient, m.httpClient()))
	now := m.o.Now()
	if err == nil {
		err = checkToken(tok)
	}
	if err != nil {
		if ctx.Err() != nil && m.ctx.Err() != nil {
			return // shutting down
		}
		m.failed(st, now, err)
		return
	}
	st.failures = 0
	st.due.Store(0)
	m.count(st.id, ResultOK)
	st.cur.Store(newToken(tok, now))
	if st.refresh != "" && tok.RefreshToken != "" && tok.RefreshToken != st.refresh {
		st.refresh = tok.RefreshToken
		m.writeBack(ctx, st, v)
	}
}

// adopt takes v's client unless st already has it. A new version that carries the refresh
// token egressd wrote back is its own write: the rotated token stays in use.
func (st *state) adopt(v credential.Value) {
	if seen := st.seen.Load(); seen != nil && *seen == v.Version && st.secret != nil {
		return
	}
	o := v.OAuth2
	ours := st.wrote != "" && o.RefreshToken == st.wrote && sameClient(st.secret, o)
	if !ours {
		st.refresh = o.RefreshToken
		st.conf = &oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes,
			Endpoint: oauth2.Endpoint{TokenURL: o.TokenURL, AuthStyle: oauth2.AuthStyleAutoDetect}}
		st.cc = &clientcredentials.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes,
			TokenURL: o.TokenURL, AuthStyle: oauth2.AuthStyleAutoDetect}
	}
	st.secret = o
	version := v.Version
	st.seen.Store(&version)
}

// sameClient reports whether a and b differ in nothing but the refresh token.
func sameClient(a, b *credential.OAuth2) bool {
	return a != nil && a.ClientID == b.ClientID && a.ClientSecret == b.ClientSecret &&
		a.TokenURL == b.TokenURL && strings.Join(a.Scopes, " ") == strings.Join(b.Scopes, " ")
}

// fetch makes the token call: the refresh-token grant, or client credentials without one.
func (st *state) fetch(ctx context.Context) (*oauth2.Token, error) {
	if st.refresh == "" {
		return st.cc.Token(ctx)
	}
	return st.conf.TokenSource(ctx, &oauth2.Token{RefreshToken: st.refresh}).Token()
}

// failed counts and logs a failed call and sets when to retry; the last token stays
// served until its expiry.
func (m *Manager) failed(st *state, now time.Time, err error) {
	st.failures++
	wait := min(maxBackoff, minBackoff<<min(st.failures-1, 5))
	wait = wait/2 + time.Duration(rand.Int64N(int64(wait/2)+1))
	st.due.Store(now.Add(wait).UnixNano())
	m.count(st.id, ResultError)
	ev := m.o.Log.Warn().Str("credential", st.id).Str("token_url", st.secret.TokenURL).
		Str("error", describe(err, st.secrets()...)).Dur("retry_in", wait)
	if t := st.cur.Load(); t != nil && now.Before(t.expiry) {
		ev = ev.Time("serving_last_token_until", t.expiry)
	} else {
		ev = ev.Bool("unavailable", true)
	}
	ev.Msg("oauth2 token refresh failed")
}

// secrets are the values no message may show.
func (st *state) secrets() []string {
	out := []string{st.secret.ClientSecret, st.refresh, st.secret.RefreshToken}
	if t := st.cur.Load(); t != nil {
		out = append(out, strings.TrimPrefix(t.headers[0].Value, "Bearer "))
	}
	return out
}

// writeBack stores the rotated refresh token, or says why it cannot.
func (m *Manager) writeBack(ctx context.Context, st *state, v credential.Value) {
	log := m.o.Log
	if m.o.Writer == nil {
		log.Warn().Str("credential", st.id).Msg("oauth2 refresh token rotated; the backend cannot be written: " +
			"the new refresh token is used from memory and is lost on restart (store it in the backend)")
		return
	}
	raw := maps.Clone(v.OAuth2.Raw)
	raw["refresh_token"] = st.refresh
	if err := m.o.Writer.Write(ctx, st.id, v.Version, raw); err != nil {
		log.Warn().Str("credential", st.id).Str("error", describe(err, st.secrets()...)).
			Msg("oauth2 refresh token rotated; writing it back failed: the new refresh token is used from memory and is lost on restart")
		return
	}
	st.wrote = st.refresh
	log.Info().Str("credential", st.id).Msg("oauth2 refresh token rotated and written back")
}

func (m *Manager) count(id, result string) {
	if m.o.Metrics != nil {
		m.o.Metrics(id, result)
	}
}

func (m *Manager) httpClient() *http.Client {
	if c := m.client.Load(); c != nil {
		return c
	}
	return noClient
}

// noClient fails every call: token calls go only through a client SetClient gave.
var noClient = &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
	return nil, errors.New("oauth: no HTTP client set")
})}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// newToken computes when to stop serving tok and when to refresh it.
func newToken(tok *oauth2.Token, now time.Time) *token {
	expiry := tok.Expiry
	if expiry.IsZero() {
		expiry = now.Add(DefaultLifetime)
	}
	life := expiry.Sub(now)
	skew := min(maxSkew, life/10)
	at := now.Add(time.Duration(float64(life) * (refreshFrom + refreshSpread*rand.Float64())))
	return &token{
		headers:   []credential.Header{{Name: "Authorization", Value: "Bearer " + tok.AccessToken}},
		expiry:    expiry.Add(-skew),
		refreshAt: at,
	}
}

// errBadToken is a token response egressd cannot use.
var errBadToken = errors.New("the token endpoint returned no usable access token (empty, expired, or not a valid header value)")

// checkToken refuses an access token that cannot be sent.
func checkToken(tok *oauth2.Token) error {
	if tok.AccessToken == "" || (!tok.Expiry.IsZero() && time.Until(tok.Expiry) <= 0) {
		return errBadToken
	}
	for i := 0; i < len(tok.AccessToken); i++ {
		if c := tok.AccessToken[i]; c < 0x21 || c == 0x7f {
			return errBadToken
		}
	}
	return nil
}
