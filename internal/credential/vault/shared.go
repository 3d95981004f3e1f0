package vault

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/egressd/egressd/internal/credential"
)

// Session is one Vault login shared by the Backends of many credential scopes (a
// node egressd's sandboxes, docs/node.md): one client, one token, one renewal
// (Run), and one KV read per path however many Backends read it. Reads of a path
// in flight at once are collapsed into one, and the outcome Vault gave (a secret,
// or its absence) is served to every Backend that reads that path within CacheFor
// of it. A cache entry is keyed by the whole KV path, so Backends whose prefixes
// resolve to the same path share a read and those whose prefixes differ never
// see each other's secrets. Leased path credentials and AWS keys stay each
// Backend's own: each read of them mints a new secret.
type Session struct {
	base     *Backend // no prefix, no paths: the session's client and login
	cacheFor time.Duration
	reads    singleflight.Group

	mu      sync.Mutex
	cache   map[string]kvRead
	swept   time.Time
	refresh map[*Backend]func() // Backends to re-read after a login that followed failed reads
}

// kvRead is one KV read's outcome, as Vault gave it.
type kvRead struct {
	sec     credential.Secret
	version string
	err     error
	at      time.Time
}

// NewSession returns a Session for o (Address, Auth, LoginBackoff, Log; its
// KVMount, KVPrefix and Paths are each Backend's). A KV path read is served again
// for cacheFor: a little under the stores' refresh interval, so that each path is
// read about once a refresh. It does not contact Vault: Run logs in.
func NewSession(o Options, cacheFor time.Duration) (*Session, error) {
	o.KVPrefix, o.Paths = "", nil
	base, err := New(o)
	if err != nil {
		return nil, err
	}
	return &Session{base: base, cacheFor: cacheFor, cache: map[string]kvRead{}, refresh: map[*Backend]func(){}}, nil
}

// Run keeps the session's token until ctx ends: login, renewal, login again
// (session.run), re-reading every Backend's credentials after a login that
// followed failed reads.
func (s *Session) Run(ctx context.Context) {
	s.base.sess.run(ctx, func() {
		s.mu.Lock()
		fns := make([]func(), 0, len(s.refresh))
		for _, fn := range s.refresh {
			fns = append(fns, fn)
		}
		s.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	})
}

// Backend returns a Backend of the session for the credentials at kvMount and
// kvPrefix, and paths (as Options'), logging to o.Log.
func (s *Session) Backend(o Options) (*Backend, error) {
	paths, err := withDefaults(o.Paths)
	if err != nil {
		return nil, err
	}
	b := *s.base
	b.kvMount, b.kvPrefix = kvPlace(o.KVMount, o.KVPrefix)
	b.paths, b.leases, b.log, b.shared = paths, newLeases(newLeaseKey()), o.Log, s
	return &b, nil
}

// watch has refresh("") called for b after a login that followed failed reads,
// until ctx ends.
func (s *Session) watch(ctx context.Context, b *Backend, refresh func(id string)) {
	s.mu.Lock()
	s.refresh[b] = func() { refresh("") }
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.refresh, b)
	s.mu.Unlock()
}

// readKV is b.readKV through the session's cache and collapsed reads.
func (s *Session) readKV(ctx context.Context, b *Backend, id string) (credential.Secret, string, error) {
	path := b.kvPath(id)
	if r, ok := s.cached(path); ok {
		return r.sec, r.version, r.err
	}
	ch := s.reads.DoChan(path, func() (any, error) {
		if r, ok := s.cached(path); ok {
			return r, nil // a read that ended between the look above and this one
		}
		// The read outlives the caller that began it (others wait for it too),
		// bounded by that caller's deadline.
		rctx, cancel := context.WithoutCancel(ctx), func() {}
		if dl, ok := ctx.Deadline(); ok {
			rctx, cancel = context.WithDeadline(rctx, dl)
		}
		defer cancel()
		r := kvRead{at: time.Now()}
		r.sec, r.version, r.err = b.readKVDirect(rctx, id)
		if r.err == nil || answered(r.err) {
			s.store(path, r)
		}
		return r, nil
	})
	select {
	case res := <-ch:
		r := res.Val.(kvRead)
		return r.sec, r.version, r.err
	case <-ctx.Done():
		return credential.Secret{}, "", ctx.Err()
	}
}

// answered reports whether err is Vault's answer about the secret (not there,
// a bad shape, revoked) rather than a failed read, which is never cached.
func answered(err error) bool {
	return errors.Is(err, credential.ErrNotFound) || errors.Is(err, credential.ErrInvalid) || errors.Is(err, credential.ErrRevoked)
}

func (s *Session) cached(path string) (kvRead, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.cache[path]
	return r, ok && time.Since(r.at) < s.cacheFor
}

// store caches r for path, dropping the entries past cacheFor once a cacheFor.
func (s *Session) store(path string, r kvRead) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache[path] = r
	if time.Since(s.swept) < s.cacheFor {
		return
	}
	s.swept = time.Now()
	for p, e := range s.cache {
		if time.Since(e.at) >= s.cacheFor {
			delete(s.cache, p)
		}
	}
}

// forget drops path's cached read.
func (s *Session) forget(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, path)
}
