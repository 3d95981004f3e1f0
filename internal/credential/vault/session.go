package vault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"
)

// Defaults of the login lifecycle.
const (
	// DefaultLoginBackoff is the wait after a failed login; it doubles with every further
	// failure up to DefaultMaxLoginBackoff, ±20%, so that replicas do not retry in step.
	DefaultLoginBackoff    = time.Second
	DefaultMaxLoginBackoff = time.Minute
	// tokenPoll is how often a token file is checked for a new token.
	tokenPoll     = time.Second
	backoffJitter = 0.2
)

// session holds egressd's Vault token: it logs in (on the first read, or in the
// background after a failure), renews the token with api.LifetimeWatcher, logs in again
// before a token that cannot be renewed further expires, and again at once when Vault
// rejects the token (revoked, expired). Logins are serialised; a failed one is retried
// with backoff, never more often. Token values live in the client and in login, and are
// never logged.
type session struct {
	client     *api.Client
	auth       AuthMethod
	log        zerolog.Logger
	minBackoff time.Duration
	maxBackoff time.Duration

	mu          sync.Mutex // serialises logins; guards the fields below
	cur         *login     // nil: no usable token
	failures    int        // consecutive failed logins
	lastErr     error      // of the last failed login
	retryAt     time.Time  // no login before this after a failure
	rejected    bool       // cur was rejected by Vault since the last good login
	needRefresh bool       // reads failed for want of a token: re-read every ID

	wake chan struct{} // cap 1: cur changed
}

// login is one successful login. token is the client token: never printed.
type login struct {
	token     string
	ttl       time.Duration // 0: the token does not expire
	renewable bool
	secret    *api.Secret // the login response, for the LifetimeWatcher
}

func newSession(c *api.Client, auth AuthMethod, log zerolog.Logger, minBackoff, maxBackoff time.Duration) *session {
	return &session{client: c, auth: auth, log: log, minBackoff: minBackoff, maxBackoff: maxBackoff,
		wake: make(chan struct{}, 1)}
}

// token returns the current login, logging in first when there is none and no backoff
// is pending; during a backoff it returns the last login error at once.
func (s *session) token(ctx context.Context) (*login, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return s.cur, nil
	}
	if time.Now().Before(s.retryAt) {
		return nil, s.lastErr
	}
	return s.loginLocked(ctx)
}

// loginLocked logs in with a token-less copy of the client and makes the result current.
func (s *session) loginLocked(ctx context.Context) (*login, error) {
	l, err := s.doLogin(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("vault login (%s): %w", s.auth.Name(), ctx.Err())
		}
		s.failures++
		s.lastErr = fmt.Errorf("vault login (%s): %w", s.auth.Name(), err)
		s.retryAt = time.Now().Add(s.backoff(s.failures))
		if s.cur == nil {
			s.needRefresh = true
		}
		s.log.Warn().Str("method", s.auth.Name()).Int("failures", s.failures).
			Time("retry_at", s.retryAt).Err(s.lastErr).Msg("vault login failed")
		return nil, s.lastErr
	}
	s.client.SetToken(l.token)
	if s.rejected || s.failures > 0 {
		s.needRefresh = true
	}
	s.cur, s.failures, s.lastErr, s.retryAt, s.rejected = l, 0, nil, time.Time{}, false
	s.log.Info().Str("method", s.auth.Name()).Int("ttl_seconds", int(l.ttl/time.Second)).
		Bool("renewable", l.renewable).Msg("vault login")
	s.notify()
	return l, nil
}

func (s *session) doLogin(ctx context.Context) (*login, error) {
	c, err := s.client.CloneWithHeaders() // keeps the namespace header
	if err != nil {
		return nil, err
	}
	c.ClearToken()
	sec, err := s.auth.Login(ctx, c)
	switch {
	case err != nil:
		return nil, err
	case sec == nil || sec.Auth == nil || sec.Auth.ClientToken == "":
		return nil, errors.New("the login response holds no token (MFA and response wrapping are not supported)")
	}
	return &login{
		token:     sec.Auth.ClientToken,
		ttl:       time.Duration(sec.Auth.LeaseDuration) * time.Second,
		renewable: sec.Auth.Renewable,
		secret:    sec,
	}, nil
}

// backoff is the wait after the n-th consecutive failure.
func (s *session) backoff(n int) time.Duration {
	d := s.minBackoff
	for i := 1; i < n && d < s.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.maxBackoff)
	return d + time.Duration(float64(d)*backoffJitter*(2*rand.Float64()-1))
}

func (s *session) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *session) current() (*login, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.retryAt
}

// checkRejected is called after Vault refused a read with l's token: it looks the token up
// and, when Vault refuses that too, drops l (the next read logs in again) and reports true.
// A token that looks up fine was refused by policy: nothing to log in again for.
func (s *session) checkRejected(ctx context.Context, l *login) bool {
	c, err := s.client.CloneWithHeaders()
	if err != nil {
		return false
	}
	c.SetToken(l.token)
	_, err = c.Auth().Token().LookupSelfWithContext(ctx)
	if err == nil || !isForbidden(describe("GET", "auth/token/lookup-self", err, l.token)) {
		return false
	}
	s.mu.Lock()
	if s.cur == l {
		s.cur, s.rejected = nil, true
		s.log.Warn().Str("method", s.auth.Name()).Msg("vault rejected the token (revoked or expired); logging in again")
	}
	s.mu.Unlock()
	s.notify()
	return true
}

// takeRefresh reports, once, that reads failed for want of a token and a login has
// since succeeded.
func (s *session) takeRefresh() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || !s.needRefresh {
		return false
	}
	s.needRefresh = false
	return true
}

// run keeps a token until ctx ends: it logs in when there is none (retrying with
// backoff), watches the current one (renewal, token file), and replaces it when it can no
// longer be renewed. After a login that follows failed reads it calls refreshAll, so that
// every credential is read again at once rather than at its next refresh.
func (s *session) run(ctx context.Context, refreshAll func()) {
	for ctx.Err() == nil {
		l, retryAt := s.current()
		if l == nil {
			if !s.sleepUntil(ctx, retryAt) {
				return
			}
			s.mu.Lock()
			if s.cur == nil && !time.Now().Before(s.retryAt) {
				_, _ = s.loginLocked(ctx) // a failure is logged, and retried after backoff
			}
			s.mu.Unlock()
		} else if s.watch(ctx, l) {
			s.replace(ctx, l)
		}
		if s.takeRefresh() {
			refreshAll()
		}
	}
}

// sleepUntil waits for t, a change of the current login, or the end of ctx (false).
func (s *session) sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-s.wake:
	case <-timer.C:
	}
	return true
}

// watch follows l until it must be replaced (true): its renewal ended (max TTL reached,
// not renewable, or renewal kept failing until the end of its lease), or its token file
// holds a new token. It returns false when l stopped being current (rejected, replaced)
// or ctx ended. A given token (TokenAuth) whose renewal ended is kept until Vault rejects
// it or the file changes: logging in again would only present the same token.
func (s *session) watch(ctx context.Context, l *login) bool {
	var done <-chan error
	var renewed <-chan *api.RenewOutput
	if l.ttl > 0 {
		w, err := s.client.NewLifetimeWatcher(&api.LifetimeWatcherInput{Secret: l.secret})
		if err != nil {
			s.log.Warn().Err(err).Msg("vault token renewal cannot start")
		} else {
			go w.Start()
			defer w.Stop()
			done, renewed = w.DoneCh(), w.RenewCh()
		}
	}
	ch, given := s.auth.(changer)
	var poll <-chan time.Time
	if given {
		t := time.NewTicker(tokenPoll)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-s.wake:
			if cur, _ := s.current(); cur != l {
				return false
			}
		case r := <-renewed:
			ev := s.log.Debug()
			if r != nil && r.Secret != nil && r.Secret.Auth != nil {
				ev = ev.Int("ttl_seconds", r.Secret.Auth.LeaseDuration)
			}
			ev.Msg("vault token renewed")
		case err := <-done:
			done, renewed = nil, nil
			ev := s.log.Info()
			if err != nil {
				ev = s.log.Warn().Err(describe("vault renew", "auth/token/renew-self", err, l.token))
			}
			if !given {
				ev.Msg("vault token renewal ended; logging in again before it expires")
				return true
			}
			ev.Msg("vault token renewal ended; the token is used until Vault rejects it or its file changes")
		case <-poll:
			if ch.Changed() {
				s.log.Info().Msg("vault token file changed; using the new token")
				return true
			}
		}
	}
}

// replace logs in again while l is still current, retrying with backoff; l stays in use
// until the new login succeeds or Vault rejects it.
func (s *session) replace(ctx context.Context, l *login) {
	for ctx.Err() == nil {
		s.mu.Lock()
		if s.cur != l {
			s.mu.Unlock()
			return
		}
		_, err := s.loginLocked(ctx)
		retryAt := s.retryAt
		s.mu.Unlock()
		if err == nil || !s.sleepUntil(ctx, retryAt) {
			return
		}
	}
}
