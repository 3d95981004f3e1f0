package credential

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of Options, taken by zero values.
const (
	// DefaultMaxStale is how long the last good value keeps being served while reads fail
	// (backend down, file unreadable). Past it the credential is unavailable and requests
	// that need it fail closed with credential_unavailable: longer rides out longer outages,
	// but also keeps serving a secret that may have been revoked.
	DefaultMaxStale = 5 * time.Minute
	// DefaultRefresh is how often each ID is re-read in the background.
	DefaultRefresh = 30 * time.Second
	// DefaultJitter spreads each refresh over Refresh ± 10% so that IDs, and replicas,
	// do not read the backend in lockstep (consul-template's leaseCheckWait).
	DefaultJitter = 0.1
	// DefaultReadTimeout bounds one backend read, at Start and in the background.
	DefaultReadTimeout = 10 * time.Second

	maxJitter       = 0.5              // the interval never drops below Refresh/2
	minRefresh      = time.Millisecond // floor of the MaxStale/3 cap: never a busy loop
	readParallelism = 8                // concurrent reads when every ID is read at once
	staleRefreshDiv = 3                // Refresh is capped at MaxStale/staleRefreshDiv
	ageDigits       = 1000             // age_seconds is rounded to the millisecond
)

// FirstReadWait bounds how long a request that needs a credential waits for that
// credential's first read (or an oauth2 credential's first token) while it is still
// in flight after a start, instead of failing at once with credential_unavailable.
// Only the first read is waited for: later reads never hold a request, which is
// served from memory. A few seconds: a backend that answers at all answers sooner,
// and a client's own timeout is longer.
const FirstReadWait = 5 * time.Second

// Results of one read: the result label of credential_refresh_total.
const (
	ResultOK       = "ok"
	ResultError    = "error"     // a failed read: the last good value is served until MaxStale
	ResultNotFound = "not_found" // the backend answered without the ID: unavailable at once
	ResultInvalid  = "invalid"   // the secret has a bad shape: unavailable at once
	ResultRevoked  = "revoked"   // the secret's status is "revoked": unavailable at once
)

// errNotManaged is the Err of an UnavailableError for an ID the Store was not given.
var errNotManaged = errors.New("not a credential of this store (is it referenced by the policy?)")

// Options configure a Store. Zero values take the defaults above.
type Options struct {
	// MaxStale is how long the last good value is served while reads fail; default
	// DefaultMaxStale (5m).
	MaxStale time.Duration
	// Refresh is the background re-read interval of each ID; default DefaultRefresh (30s).
	// It is capped at MaxStale/3, so that a credential whose reads succeed never goes stale
	// between two of them.
	Refresh time.Duration
	// Jitter is the fraction of Refresh each interval varies by, up or down; default
	// DefaultJitter (0.1); negative means none; capped at 0.5.
	Jitter float64
	// ReadTimeout bounds one backend read; default DefaultReadTimeout (10s).
	ReadTimeout time.Duration
	// Now is the clock for read times and staleness; default time.Now (tests set it).
	Now func() time.Time
	// Log receives rotation (info) and read-failure (warn) lines, never values; the zero
	// Logger discards them.
	Log zerolog.Logger
	// Metrics, when set, is told the result of every read and the age of the last good value.
	Metrics *Metrics
}

// Metrics are callbacks, so that the Store does not import the metrics package. Either may
// be nil. Both are called from refresh goroutines, never on the request path.
type Metrics struct {
	// Refresh is called after every read with ResultOK, ResultError, ResultNotFound or
	// ResultInvalid (credential_refresh_total{credential,result}).
	Refresh func(id, result string)
	// Age is called after every read of an ID that has a good value, with the seconds
	// since that value was read (credential_age_seconds{credential}). IDs never read
	// successfully are not reported.
	Age func(id string, seconds float64)
}

// Status is one credential's state for /readyz.
type Status struct {
	Ready      bool    `json:"ready"`             // Get would return the value now
	Pending    bool    `json:"pending,omitempty"` // the first read is still in flight
	Version    string  `json:"version,omitempty"` // of the last good value
	AgeSeconds float64 `json:"age_seconds"`       // since the last good read; 0 when never read
	// Error is the cause class and the last read's error, e.g. "stale: open creds.json: no
	// such file or directory"; on a ready credential, "refresh_failed: ..." says that the
	// last good value is being served while reads fail.
	Error string `json:"error,omitempty"`
}

// Store serves the last good value of each credential ID from memory and refreshes it from a
// Backend in the background. Get, Status and Ready never wait for a read.
//
// Lifecycle: NewStore, Start(ctx) (reads every ID once, then refreshes until ctx ends),
// Wait (after ctx ends, for the background goroutines to exit). Between reads a Store parks
// no goroutine: refreshes wait on timers and file changes arrive by callback, so a node's
// idle sandboxes cost the garbage collector no stacks to scan.
type Store struct {
	backend Backend
	o       Options
	ids     []string          // sorted
	entries map[string]*entry // fixed by NewStore: read concurrently without a lock
	started atomic.Bool
	tasks   Tasks
	timerMu sync.Mutex    // guards every entry's timer
	first   chan struct{} // closed once the first read of every ID is done

	subMu sync.Mutex
	subs  []func(id string) // told of every read (Subscribe); appended to, never changed
}

// entry is one credential ID. Reads of it are serialised by mu, so that a slow read can never
// overwrite the result of a later one; Get only loads cur.
type entry struct {
	id    string
	mu    sync.Mutex
	cur   atomic.Pointer[state]
	first chan struct{} // closed once the first read is done (or Start's ctx ended)
	once  sync.Once
	timer *time.Timer // the next background refresh (Store.timerMu)
}

// firstDone closes e.first, once.
func (e *entry) firstDone() { e.once.Do(func() { close(e.first) }) }

// state is immutable once stored: a refresh stores a new one.
type state struct {
	good    Value  // the last good value, when hasGood
	hasGood bool   // a read has succeeded
	result  string // of the last read; "" before the first
	err     error  // of the last read; nil after a good one
}

// NewStore manages ids (those the policy references; duplicates and "" are dropped) over b.
func NewStore(b Backend, ids []string, o Options) *Store {
	s := &Store{backend: b, o: o.withDefaults(), entries: make(map[string]*entry, len(ids)), first: make(chan struct{})}
	for _, id := range ids {
		if id == "" || s.entries[id] != nil {
			continue
		}
		e := &entry{id: id, first: make(chan struct{})}
		e.cur.Store(&state{})
		s.entries[id] = e
		s.ids = append(s.ids, id)
	}
	slices.Sort(s.ids)
	return s
}

func (o Options) withDefaults() Options {
	if o.MaxStale <= 0 {
		o.MaxStale = DefaultMaxStale
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	o.Refresh = min(o.Refresh, max(o.MaxStale/staleRefreshDiv, minRefresh))
	switch {
	case o.Jitter == 0:
		o.Jitter = DefaultJitter
	case o.Jitter < 0:
		o.Jitter = 0
	case o.Jitter > maxJitter:
		o.Jitter = maxJitter
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Get returns the last good value of id from memory; it never blocks on I/O and does not
// allocate when the value is servable. The returned Headers slice is shared: do not modify
// it. The error is an *UnavailableError when id was never read successfully, when the last
// read did not find it or found an invalid secret (unavailable at once: the backend
// answered), or when the last good read is older than MaxStale. A failed read keeps the last
// good value servable until MaxStale. An ID the Store does not manage is never_read.
func (s *Store) Get(id string) (Value, error) {
	e := s.entries[id]
	if e == nil {
		return Value{}, &UnavailableError{ID: id, Cause: CauseNeverRead, Err: errNotManaged}
	}
	st := e.cur.Load()
	if ue := st.unavailable(id, s.o.Now(), s.o.MaxStale); ue != nil {
		return Value{}, ue
	}
	return st.good, nil
}

// unavailable returns why st cannot be served at now, or nil.
func (st *state) unavailable(id string, now time.Time, maxStale time.Duration) *UnavailableError {
	switch {
	case st.result == ResultNotFound:
		return &UnavailableError{ID: id, Cause: CauseNotFound, Err: st.err}
	case st.result == ResultInvalid:
		return &UnavailableError{ID: id, Cause: CauseInvalid, Err: st.err}
	case st.result == ResultRevoked:
		return &UnavailableError{ID: id, Cause: CauseRevoked, Err: st.err}
	case !st.hasGood:
		return &UnavailableError{ID: id, Cause: CauseNeverRead, Err: st.err}
	case now.Sub(st.good.ReadAt) > maxStale:
		return &UnavailableError{ID: id, Cause: CauseStale, Err: st.err}
	}
	return nil
}

// Status reports every ID's state, for /readyz.
func (s *Store) Status() map[string]Status {
	now := s.o.Now()
	out := make(map[string]Status, len(s.ids))
	for _, id := range s.ids {
		e := s.entries[id]
		out[id] = e.cur.Load().status(id, now, s.o.MaxStale)
		if !e.done() {
			st := out[id]
			st.Pending, st.Error = true, ""
			out[id] = st
		}
	}
	return out
}

// done reports whether e's first read is done.
func (e *entry) done() bool {
	select {
	case <-e.first:
		return true
	default:
		return false
	}
}

// FirstRead is closed once the first read of every ID is done (StartAsync).
func (s *Store) FirstRead() <-chan struct{} { return s.first }

// AwaitFirst waits until id's first read is done, or ctx ends: a request that
// needs id right after a start waits for the read in flight rather than failing.
// It returns at once for an ID read before, or one the Store does not manage.
func (s *Store) AwaitFirst(ctx context.Context, id string) {
	if e := s.entries[id]; e != nil {
		select {
		case <-e.first:
		case <-ctx.Done():
		}
	}
}

func (st *state) status(id string, now time.Time, maxStale time.Duration) Status {
	var out Status
	if st.hasGood {
		out.Version = st.good.Version
		out.AgeSeconds = math.Round(now.Sub(st.good.ReadAt).Seconds()*ageDigits) / ageDigits
	}
	if ue := st.unavailable(id, now, maxStale); ue != nil {
		out.Error = ue.Cause
		if ue.Err != nil {
			out.Error += ": " + ue.Err.Error()
		}
		return out
	}
	out.Ready = true
	if st.err != nil {
		out.Error = "refresh_failed: " + st.err.Error()
	}
	return out
}

// Ready reports whether every ID is servable now (true when there are none).
func (s *Store) Ready() bool {
	now := s.o.Now()
	for _, id := range s.ids {
		if s.entries[id].cur.Load().unavailable(id, now, s.o.MaxStale) != nil {
			return false
		}
	}
	return true
}

// IDs returns the managed credential IDs, sorted.
func (s *Store) IDs() []string { return slices.Clone(s.ids) }
