// Package oauth keeps the tokens egressd mints for credentials: the access tokens of oauth2
// credentials and the installation tokens of github_app ones. For an oauth2 credential it
// exchanges the refresh token (RFC 6749 §6) or, without one, the client credentials (§4.4) at
// token_url with golang.org/x/oauth2, uses a rotated refresh token from then on and writes it
// back where the backend can be written; for a github_app one it signs the App's JWT and asks
// GitHub for an installation token scoped to the credential's repositories (github.go). For
// both it caches the token and refreshes it ahead of expiry (jittered, one refresh per
// credential at a time), and keeps serving the last token while the endpoint fails, until it
// expires.
//
// Token calls follow egressd's own schedule, never the sandbox's: after a failure no call
// starts before the back-off (exponential, jittered, capped) allows, however many requests
// find no token; each attempt is one call, in the client authentication learnt for the
// endpoint (see exchange).
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

	"github.com/cenkalti/backoff/v4"
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
)

// The back-off after failed token calls. Identity providers lock out clients that retry
// too fast, so requests never shorten it: the nth retry waits retryFirst·retryFactor^(n-1),
// at most retryCap, each ±retryJitter.
const (
	// retryFirst is the wait after the first failure.
	retryFirst = time.Second
	// retryFactor multiplies the wait after each further failure.
	retryFactor = 2
	// retryCap is the longest wait before jitter: at most about one call a minute per
	// credential while the endpoint keeps failing (the Vault login's cap too).
	retryCap = time.Minute
	// retryJitter spreads each wait by this fraction either way, so that credentials and
	// replicas failing together do not retry in step.
	retryJitter = 0.5
)

// Results of a token call (one HTTP exchange with the endpoint): the result label of
// egressd_oauth_refresh_total.
const (
	ResultOK    = "ok"
	ResultError = "error"
)

// Source is the credential store the Manager reads the oauth2 clients and GitHub Apps from.
type Source interface {
	Get(id string) (credential.Value, error)
	IDs() []string
}

// Notifier is a Source that tells of every change of a credential's value
// (credential.Store.Subscribe).
type Notifier interface {
	Subscribe(fn func(id string))
}

// Options configure a Manager; zero values take the defaults.
type Options struct {
	// Writer stores a rotated refresh token; nil: it is kept in memory only, with a WARN.
	Writer credential.Writer
	// Metrics, when set, is called after every oauth2 token call (one HTTP exchange; none
	// without a client) with ResultOK or ResultError.
	Metrics func(id, result string)
	// Mint, when set, is called after every github_app token call, like Metrics.
	Mint func(id, result string)
	Log  zerolog.Logger
	Now  func() time.Time // default time.Now
	Tick time.Duration    // default DefaultTick
}

// Manager serves credentials from a Source, with the current token as the Authorization
// header of every oauth2 and github_app one. It is an inject.Credentials.
type Manager struct {
	src    Source
	o      Options
	client atomic.Pointer[func() *http.Client] // SetClientFunc's, built at its first call
	mu     sync.Mutex
	states map[string]*state
	styles authStyles // learnt client authentication, per endpoint and client
	ctx    context.Context
	tasks  credential.Tasks
	// notified: the Source tells of its changes (Notifier), so the loop ends while no
	// credential is minted and a change starts it again; else it ticks always.
	notified bool

	loopMu  sync.Mutex
	live    bool // Start has begun the loop: a change may restart it
	looping bool // the loop runs
	poked   bool // a change came since the loop last looked
}

// state is one oauth2 credential.
type state struct {
	id   string
	busy atomic.Bool            // a refresh is running or queued (single flight)
	cur  atomic.Pointer[token]  // the last access token; nil before the first
	seen atomic.Pointer[string] // the backend version last adopted
	due  atomic.Int64           // unix nanos before which no retry starts after a failure
	// first is closed once the first attempt is done, whatever its outcome: a request
	// waits for it (AwaitToken) rather than failing while it is in flight.
	first     chan struct{}
	firstOnce sync.Once

	mu       sync.Mutex            // serialises refreshes; guards the fields below
	secret   *credential.OAuth2    // an oauth2 credential's client, or nil
	app      *credential.GitHubApp // a github_app credential's installation, or nil
	refresh  string                // the refresh token in use (rotated ones included)
	wrote    string                // the last refresh token written back
	failures int                   // consecutive failed attempts
	retry    *backoff.ExponentialBackOff
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
	m := &Manager{src: src, o: o, states: map[string]*state{}, styles: authStyles{m: map[styleKey]learnt{}},
		ctx: context.Background()}
	m.tasks.Bind(m.ctx)
	if n, ok := src.(Notifier); ok {
		m.notified = true
		n.Subscribe(m.poke)
	}
	return m
}

// SetClient sets the HTTP client of token calls (NewClient's), e.g. after a reload.
func (m *Manager) SetClient(c *http.Client) { m.SetClientFunc(func() *http.Client { return c }) }

// SetClientFunc is SetClient for a client built by newClient at the first token
// call: most of a node's sandboxes name no minted credential, and need none.
func (m *Manager) SetClientFunc(newClient func() *http.Client) {
	get := sync.OnceValue(newClient)
	m.client.Store(&get)
}

// tokenClient is the client SetClientFunc set; nil before.
func (m *Manager) tokenClient() *http.Client {
	if get := m.client.Load(); get != nil {
		return (*get)()
	}
	return nil
}

// Start fetches a token for every minted credential of the Source (bounded by the call
// timeout), then refreshes in the background until ctx ends. Call it once, after the
// Source has started.
func (m *Manager) Start(ctx context.Context) {
	m.ctx = ctx
	m.tasks.Bind(ctx)
	m.fetchAll()
	m.startLoop(true)
}

// StartAsync is Start without the wait, once ready is closed (the Source's first
// reads are done): the first tokens are fetched in the background, and a request
// that needs one meanwhile waits for it (AwaitToken). Call it once, instead of Start.
func (m *Manager) StartAsync(ctx context.Context, ready <-chan struct{}) {
	m.ctx = ctx
	m.tasks.Bind(ctx)
	m.tasks.Go(func() {
		select {
		case <-ready:
		case <-ctx.Done():
			return
		}
		m.fetchAll()
		m.startLoop(true)
	})
}

// fetchAll makes the first token call of every oauth2 credential at once, and waits.
func (m *Manager) fetchAll() {
	var wg sync.WaitGroup
	for _, id := range m.src.IDs() {
		if v, err := m.src.Get(id); err == nil && minted(v) {
			st := m.state(id)
			if st.busy.CompareAndSwap(false, true) {
				wg.Go(func() { m.run(st) })
			}
		}
	}
	wg.Wait()
}

// AwaitToken waits, until ctx ends, for the first access token of id when its first
// token call is still to come or in flight, starting that call if none runs; it
// returns at once for anything else (not oauth2, a token held before, a first call
// that failed). Later refreshes never hold a request: the last token serves.
func (m *Manager) AwaitToken(ctx context.Context, id string) {
	v, err := m.src.Get(id)
	if err != nil || v.OAuth2 == nil {
		return
	}
	st := m.state(id)
	if st.cur.Load() != nil {
		return
	}
	select {
	case <-st.first:
		return
	default:
	}
	m.kick(st)
	select {
	case <-st.first:
	case <-ctx.Done():
	}
}

// Await waits, until ctx ends, for id's first read by the Source (when it can wait:
// credential.Store.AwaitFirst) and then for its first access token (AwaitToken).
func (m *Manager) Await(ctx context.Context, id string) {
	if a, ok := m.src.(interface {
		AwaitFirst(context.Context, string)
	}); ok {
		a.AwaitFirst(ctx, id)
	}
	m.AwaitToken(ctx, id)
}

// Ready reports whether id can be served now: an oauth2 credential only with an
// unexpired access token. It starts nothing.
func (m *Manager) Ready(id string) bool {
	v, err := m.src.Get(id)
	if err != nil {
		return false
	}
	if v.OAuth2 == nil {
		return true
	}
	t := m.state(id).cur.Load()
	return t != nil && m.o.Now().Before(t.expiry)
}

// Pending reports whether id is an oauth2 credential whose first token call is still
// to come or in flight (a request would wait for it, AwaitToken). It starts nothing.
func (m *Manager) Pending(id string) bool {
	v, err := m.src.Get(id)
	if err != nil || v.OAuth2 == nil {
		return false
	}
	st := m.state(id)
	if st.cur.Load() != nil {
		return false
	}
	select {
	case <-st.first:
		return false
	default:
		return true
	}
}

// Wait blocks until the background work has ended (after Start's ctx ended).
func (m *Manager) Wait() { m.tasks.Wait() }

// IDs are the Source's.
func (m *Manager) IDs() []string { return m.src.IDs() }

// Get returns the Source's value of id; for a minted credential (oauth2, github_app), with
// the current token as its Authorization header, or an *credential.UnavailableError (cause
// no_access_token) at once when there is no unexpired one. Such a request starts a refresh
// in the background only when none is running and the back-off allows (kick).
func (m *Manager) Get(id string) (credential.Value, error) {
	v, err := m.src.Get(id)
	if err != nil || !minted(v) {
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
		st = &state{id: id, retry: newRetry(), first: make(chan struct{})}
		m.states[id] = st
	}
	return st
}

// newRetry is a credential's back-off; it never gives up (no maximum elapsed time).
func newRetry() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(backoff.WithInitialInterval(retryFirst), backoff.WithMultiplier(retryFactor),
		backoff.WithMaxInterval(retryCap), backoff.WithRandomizationFactor(retryJitter), backoff.WithMaxElapsedTime(0))
}

// loop looks every Tick for tokens due and secrets changed, until ctx ends. While no
// credential is minted, and the Source tells of its changes (Subscribe), it ends instead,
// and the next change starts it again (poke): a scope of static tokens parks no goroutine
// and costs no wake-up a Tick.
func (m *Manager) loop() {
	t := time.NewTicker(m.o.Tick)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.loopMu.Lock()
		m.poked = false
		m.loopMu.Unlock()
		if !m.checkAll() && m.notified && m.rest() {
			return
		}
	}
}

// startLoop starts the loop unless it runs; begin marks the start of the Manager's work,
// before which a change starts nothing.
func (m *Manager) startLoop(begin bool) {
	m.loopMu.Lock()
	defer m.loopMu.Unlock()
	m.live = m.live || begin
	if m.live && !m.looping {
		m.looping = m.tasks.Go(m.loop)
	}
}

// rest reports whether the loop may end, nothing having changed while it looked, and
// if so marks it ended.
func (m *Manager) rest() bool {
	m.loopMu.Lock()
	defer m.loopMu.Unlock()
	if m.poked {
		return false
	}
	m.looping = false
	return true
}

// checkAll checks every minted credential of the Source; false when there is none.
func (m *Manager) checkAll() bool {
	found := false
	for _, id := range m.src.IDs() {
		if v, err := m.src.Get(id); err == nil && minted(v) {
			m.check(m.state(id), v)
			found = true
		}
	}
	return found
}

// poke tells the loop of a change of the Source, starting it if it ended.
func (m *Manager) poke(string) {
	m.loopMu.Lock()
	m.poked = true
	m.loopMu.Unlock()
	m.startLoop(false)
}

// check starts a refresh of st when its token is missing or due, or its secret changed,
// unless a failure asked to wait.
func (m *Manager) check(st *state, v credential.Value) {
	now := m.o.Now()
	t, seen := st.cur.Load(), st.seen.Load()
	if t == nil || !now.Before(t.refreshAt) || seen == nil || *seen != v.Version {
		m.kick(st)
	}
}

// kick starts one refresh of st in the background unless one is running or a failure
// asked to wait. After Start it is the only way a token call begins, for the ticker and for
// requests alike: however many requests find no token, none makes a call sooner than the
// back-off allows, and concurrent ones share the running call.
func (m *Manager) kick(st *state) {
	if m.ctx.Err() != nil || !st.busy.CompareAndSwap(false, true) {
		return
	}
	// due is read only once busy is ours: a failed refresh stores it before letting go.
	if m.o.Now().UnixNano() < st.due.Load() || !m.tasks.Go(func() { m.run(st) }) {
		st.busy.Store(false)
	}
}

// run refreshes st; busy is set by the caller and cleared here.
func (m *Manager) run(st *state) {
	defer st.firstOnce.Do(func() { close(st.first) })
	defer st.busy.Store(false)
	ctx, cancel := context.WithTimeout(m.ctx, callTimeout)
	defer cancel()
	m.refresh(ctx, st)
}

// refresh makes one attempt for st (one call, or two while the client authentication is
// still unknown) and stores the outcome.
func (m *Manager) refresh(ctx context.Context, st *state) {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, err := m.src.Get(st.id)
	if err != nil || !minted(v) {
		return
	}
	st.adopt(v)
	tok, err := m.mint(ctx, st)
	now := m.o.Now()
	if err != nil {
		if ctx.Err() != nil && m.ctx.Err() != nil {
			return // shutting down
		}
		m.failed(st, now, err)
		return
	}
	m.recovered(st)
	st.cur.Store(newToken(tok, now, m.o.Tick))
	if st.refresh != "" && tok.RefreshToken != "" && tok.RefreshToken != st.refresh {
		st.refresh = tok.RefreshToken
		m.writeBack(ctx, st, v)
	}
}

// adopt takes v's client unless st already has it. A new version that carries the refresh
// token egressd wrote back is its own write: the rotated token stays in use.
func (st *state) adopt(v credential.Value) {
	if seen := st.seen.Load(); seen != nil && *seen == v.Version && (st.secret != nil || st.app != nil) {
		return
	}
	version := v.Version
	st.seen.Store(&version)
	if v.GitHubApp != nil {
		st.adoptApp(v.GitHubApp)
		return
	}
	if st.app != nil { // a type change: the installation token is not this client's
		st.app = nil
		st.cur.Store(nil)
	}
	o := v.OAuth2
	ours := st.wrote != "" && o.RefreshToken == st.wrote && sameClient(st.secret, o)
	if !ours {
		st.refresh = o.RefreshToken
	}
	st.secret = o
}

// sameClient reports whether a and b differ in nothing but the refresh token.
func sameClient(a, b *credential.OAuth2) bool {
	return a != nil && a.ClientID == b.ClientID && a.ClientSecret == b.ClientSecret &&
		a.TokenURL == b.TokenURL && strings.Join(a.Scopes, " ") == strings.Join(b.Scopes, " ")
}

// fetch makes one token call in the given client-authentication style (never auto-detect:
// golang.org/x/oauth2 would then retry every failure, a 500 too, in the other style): the
// refresh-token grant, or client credentials without a refresh token.
func (st *state) fetch(ctx context.Context, style oauth2.AuthStyle) (*oauth2.Token, error) {
	o := st.secret
	if st.refresh == "" {
		cc := &clientcredentials.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes,
			TokenURL: o.TokenURL, AuthStyle: style}
		return cc.Token(ctx)
	}
	conf := &oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes,
		Endpoint: oauth2.Endpoint{TokenURL: o.TokenURL, AuthStyle: style}}
	return conf.TokenSource(ctx, &oauth2.Token{RefreshToken: st.refresh}).Token()
}

// failed logs a failed attempt, once per back-off step, and sets when the next may start;
// the last token stays served until its expiry.
func (m *Manager) failed(st *state, now time.Time, err error) {
	st.failures++
	wait := st.retry.NextBackOff()
	st.due.Store(now.Add(wait).UnixNano())
	ev := m.o.Log.Warn().Str("credential", st.id).Str("token_url", st.tokenURL()).
		Str("error", describe(err, st.secrets()...)).Int("failures", st.failures).Dur("retry_in", wait)
	if t := st.cur.Load(); t != nil && now.Before(t.expiry) {
		ev = ev.Time("serving_last_token_until", t.expiry)
	} else {
		ev = ev.Bool("unavailable", true)
	}
	ev.Msg(st.kind() + " token refresh failed")
}

// recovered clears st's back-off after a good call, saying so if calls had failed.
func (m *Manager) recovered(st *state) {
	if st.failures > 0 {
		m.o.Log.Info().Str("credential", st.id).Int("failures", st.failures).Msg(st.kind() + " token refresh recovered")
	}
	st.failures = 0
	st.retry.Reset()
	st.due.Store(0)
}

// secrets are the values no message may show.
func (st *state) secrets() []string {
	out := []string{st.refresh}
	if st.secret != nil {
		out = append(out, st.secret.ClientSecret, st.secret.RefreshToken)
	}
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

// call makes one token call for st in style through the client SetClient gave, and counts
// it: egressd_oauth_refresh_total counts the calls handed to that client, one per HTTP
// exchange with the endpoint, and nothing else.
func (m *Manager) call(ctx context.Context, st *state, style oauth2.AuthStyle) (*oauth2.Token, error) {
	c := m.tokenClient()
	if c == nil {
		return nil, errNoClient
	}
	tok, err := st.fetch(context.WithValue(ctx, oauth2.HTTPClient, c), style)
	if err == nil {
		err = checkToken(tok)
	}
	if m.o.Metrics != nil {
		m.o.Metrics(st.id, result(err))
	}
	return tok, err
}

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultOK
}

// errNoClient: token calls go only through a client SetClient gave.
var errNoClient = errors.New("oauth: no HTTP client set")

// newToken computes when to stop serving tok and when to refresh it. The refresh is
// found by a tick, so it is due at least two ticks before the token stops being served:
// a short-lived token is then replaced before it expires, not a tick after.
func newToken(tok *oauth2.Token, now time.Time, tick time.Duration) *token {
	expiry := tok.Expiry
	if expiry.IsZero() {
		expiry = now.Add(DefaultLifetime)
	}
	life := expiry.Sub(now)
	skew := min(maxSkew, life/10)
	at := now.Add(time.Duration(float64(life) * (refreshFrom + refreshSpread*rand.Float64())))
	if latest := expiry.Add(-skew - 2*tick); at.After(latest) {
		at = latest // before now for a token shorter than that: refreshed at the next tick
	}
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
