package vault

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
)

// Path is a credential read from any Vault path rather than KV: the string Field of the
// response's data, put into Format, is the value of Header.
//
//	{Path: "identity/oidc/token/agent"}  ->  Authorization: Bearer <the identity token>
type Path struct {
	Path   string // API path without /v1/, e.g. identity/oidc/token/agent
	Field  string // default config.DefaultVaultPathField ("token")
	Header string // default config.DefaultVaultPathHeader (Authorization)
	Format string // "{}" once stands for the value; default config.DefaultVaultPathFormat ("Bearer {}")
}

func (p Path) withDefaults(id string) (Path, error) {
	p.Path = strings.Trim(p.Path, "/")
	p.Field = or(p.Field, config.DefaultVaultPathField)
	p.Header = http.CanonicalHeaderKey(or(p.Header, config.DefaultVaultPathHeader))
	p.Format = or(p.Format, config.DefaultVaultPathFormat)
	switch {
	case p.Path == "":
		return p, fmt.Errorf("vault: credential %s: path is empty", id)
	case strings.Count(p.Format, placeholder) != 1:
		return p, fmt.Errorf(`vault: credential %s: format must contain "{}" exactly once`, id)
	}
	return p, nil
}

// placeholder stands for the value in Path.Format.
const placeholder = "{}"

// format puts value into the format's one placeholder; value itself is not scanned.
func format(f, value string) string {
	i := strings.Index(f, placeholder)
	if i < 0 {
		return f
	}
	return f[:i] + value + f[i+len(placeholder):]
}

// Timing of leased and short-lived path credentials.
const (
	// refreshFraction: such a credential is read again (or its lease renewed) after this
	// fraction of its lifetime, ± refreshJitter of it, so the new value is in memory well
	// before the old one expires, as Vault's LifetimeWatcher does for tokens.
	refreshFraction = 2.0 / 3
	refreshJitter   = 0.05
	// minRetry bounds how soon a failed re-read of a still valid credential is retried.
	minRetry = time.Second
)

// leased is the last good read of a path credential with a lifetime: a Vault lease
// (lease_duration) or a token with a "ttl" field (identity tokens). Until refreshAt, Read
// serves it without asking Vault: each read of such a path mints a new secret.
type leased struct {
	headers   []credential.Header
	aws       *credential.AWS // a vault_aws credential's keys (aws.go); nil for a path
	revoke    bool            // revoke the lease once replaced or at shutdown (aws.go)
	version   string
	leaseID   string
	renewable bool
	lifetime  time.Duration
	expires   time.Time
	refreshAt time.Time
}

// leases remembers the leased credentials and when each must be read again; run calls
// refresh for each at its time. version keys the HMAC of unleased values.
type leases struct {
	key  [32]byte
	mu   sync.Mutex
	byID map[string]*leased
	wake chan struct{} // cap 1: a refresh time changed
}

func newLeases(key [32]byte) *leases {
	return &leases{key: key, byID: map[string]*leased{}, wake: make(chan struct{}, 1)}
}

func (ls *leases) get(id string) *leased {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.byID[id]
}

// set stores l (nil: forget id) and wakes run.
func (ls *leases) set(id string, l *leased) {
	ls.mu.Lock()
	if l == nil {
		delete(ls.byID, id)
	} else {
		ls.byID[id] = l
	}
	ls.mu.Unlock()
	select {
	case ls.wake <- struct{}{}:
	default:
	}
}

// retryLater schedules another attempt for cur, whose renewal or re-read failed at now:
// after a third of its remaining lifetime (at least minRetry), never after it expires.
// Until then Read serves cur; an expired cur is not rescheduled (the next Read re-reads).
func (ls *leases) retryLater(id string, cur *leased, now time.Time) {
	if !now.Before(cur.expires) {
		return
	}
	t := now.Add(max(minRetry, cur.expires.Sub(now)/3))
	if t.After(cur.expires) {
		t = cur.expires
	}
	ls.mu.Lock()
	if l := ls.byID[id]; l != nil {
		c := *l
		c.refreshAt = t
		ls.byID[id] = &c
	}
	ls.mu.Unlock()
	select {
	case ls.wake <- struct{}{}:
	default:
	}
}

// due returns the IDs whose refresh time has come (each once: its time is cleared until
// the read stores a new one) and the next refresh time (zero: none).
func (ls *leases) due(now time.Time) (ids []string, next time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for id, l := range ls.byID {
		switch {
		case l.refreshAt.IsZero():
		case !now.Before(l.refreshAt):
			ids = append(ids, id)
			c := *l
			c.refreshAt = time.Time{} // due and handed out: the next Read renews or re-reads
			ls.byID[id] = &c
		case next.IsZero() || l.refreshAt.Before(next):
			next = l.refreshAt
		}
	}
	slices.Sort(ids)
	return ids, next
}

// run calls refresh(id), each in its own goroutine, when id's refresh time comes, until
// ctx ends; it returns once those calls have.
func (ls *leases) run(ctx context.Context, refresh func(id string)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ids, next := ls.due(time.Now())
		for _, id := range ids {
			wg.Go(func() { refresh(id) })
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = time.Until(next)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-ls.wake:
		case <-timer.C:
		}
	}
}

// readPath serves a leased credential from memory until its refresh time; then renews its
// lease when it can and the renewal extends it, and reads the path again otherwise.
func (b *Backend) readPath(ctx context.Context, id string, p Path) ([]credential.Header, string, error) {
	l, err := b.readLeased(ctx, id, func(ctx context.Context) (*leased, error) { return b.fetchPath(ctx, id, p) })
	if err != nil {
		return nil, "", err
	}
	return l.headers, l.version, nil
}

// readLeased serves id's last read from memory until its refresh time; then renews its
// lease when it can and the renewal extends it, and calls fetch otherwise. A value without
// a lifetime is fetched at every read.
func (b *Backend) readLeased(ctx context.Context, id string, fetch func(context.Context) (*leased, error)) (*leased, error) {
	now := time.Now()
	cur := b.leases.get(id)
	if cur != nil && now.Before(cur.refreshAt) {
		return cur, nil
	}
	if cur != nil && cur.renewable && now.Before(cur.expires) {
		renewed, err := b.renew(ctx, id, cur, now)
		if err != nil {
			b.leases.retryLater(id, cur, now)
			return nil, err
		}
		if renewed {
			return b.leases.get(id), nil
		}
	}
	l, err := fetch(ctx)
	switch {
	case err == nil && l.lifetime > 0:
		b.replaced(cur, l)
		b.leases.set(id, l)
		return l, nil
	case err == nil:
		b.leases.set(id, nil)
		return l, nil
	case errors.Is(err, credential.ErrNotFound) || errors.Is(err, credential.ErrInvalid):
		b.leases.set(id, nil)
	case cur != nil:
		b.leases.retryLater(id, cur, now)
	}
	return nil, err
}

// renew renews cur's lease. It reports false (read the path again) when Vault refuses the
// renewal (lease revoked, not renewable) or the renewal no longer extends the lease by half
// its lifetime (its max TTL is near); an error when Vault could not be asked.
func (b *Backend) renew(ctx context.Context, id string, cur *leased, now time.Time) (bool, error) {
	sec, err := b.client.Sys().RenewWithContext(ctx, cur.leaseID, 0)
	if err != nil {
		err = describe("vault renew", "sys/leases/renew", err)
		var se *statusError
		if errors.As(err, &se) && se.status >= 400 && se.status < 500 {
			b.log.Info().Str("credential", id).Err(err).Msg("vault lease not renewed; reading the path again")
			return false, nil
		}
		return false, err
	}
	if sec == nil || time.Duration(sec.LeaseDuration)*time.Second < cur.lifetime/2 {
		return false, nil
	}
	life := time.Duration(sec.LeaseDuration) * time.Second
	c := *cur
	c.expires, c.refreshAt = now.Add(life), now.Add(refreshAfter(life))
	b.leases.set(id, &c)
	b.log.Debug().Str("credential", id).Int("lease_seconds", int(life/time.Second)).Msg("vault lease renewed")
	return true, nil
}

// fetchPath reads p and builds the credential (lifetime 0: none).
func (b *Backend) fetchPath(ctx context.Context, id string, p Path) (*leased, error) {
	sec, err := b.readSecret(ctx, p.Path)
	if err != nil {
		return nil, err
	}
	raw, ok := sec.Data[p.Field]
	if !ok {
		return nil, fmt.Errorf("credential %s: the data at %s has no field %s (it has %s): %w",
			id, p.Path, strconv.Quote(p.Field), fieldNames(sec.Data), credential.ErrInvalid)
	}
	value, ok := raw.(string)
	if !ok || value == "" {
		return nil, fmt.Errorf("credential %s: field %s at %s is not a non-empty string: %w",
			id, strconv.Quote(p.Field), p.Path, credential.ErrInvalid)
	}
	// ParseSecret checks the header name and the value (control characters, whitespace)
	// and names only the ID and the header in its errors.
	headers, err := credential.ParseSecret(id, map[string]any{"headers": map[string]any{p.Header: format(p.Format, value)}})
	if err != nil {
		return nil, err
	}
	l := b.newLeased(id, sec, value)
	l.headers = headers
	return l, nil
}

// readSecret reads path; no secret there is credential.ErrNotFound.
func (b *Backend) readSecret(ctx context.Context, path string) (*api.Secret, error) {
	sec, err := b.client.Logical().ReadWithContext(ctx, path)
	if err != nil {
		return nil, describe("vault read", path, err)
	}
	if sec == nil || sec.Data == nil {
		return nil, fmt.Errorf("%w: no secret at %s", credential.ErrNotFound, path)
	}
	return sec, nil
}

// newLeased is the lease of sec, read just now (lifetime 0: none, read again at every
// refresh); value stands for it in the version when it has no lease ID.
func (b *Backend) newLeased(id string, sec *api.Secret, value string) *leased {
	now := time.Now()
	version := sec.LeaseID
	if version == "" {
		version = b.leases.version(value)
	}
	life := time.Duration(sec.LeaseDuration) * time.Second
	if life <= 0 {
		if ttl, ok := toInt(sec.Data["ttl"]); ok && ttl > 0 { // identity tokens: data.ttl, no lease
			life = time.Duration(ttl) * time.Second
		}
	}
	l := &leased{version: version}
	if life <= 0 {
		return l
	}
	l.leaseID, l.renewable = sec.LeaseID, sec.Renewable && sec.LeaseID != ""
	l.lifetime, l.expires, l.refreshAt = life, now.Add(life), now.Add(refreshAfter(life))
	b.log.Debug().Str("credential", id).Str("version", version).Int("lifetime_seconds", int(life/time.Second)).Time("refresh_at", l.refreshAt).
		Msg("vault credential with a lifetime")
	return l
}

// version identifies an unleased value without revealing it: the first 16 hex digits of
// its HMAC-SHA256 under a key drawn at start and kept in memory only. A plain hash could
// be checked against guesses by whoever reads the logs; the keyed one cannot. It is
// stable for the process's lifetime, which is all the Store needs to tell a new value
// from the old (such values differ between replicas anyway: each mints its own).
func (ls *leases) version(value string) string {
	m := hmac.New(sha256.New, ls.key[:])
	m.Write([]byte(value))
	return "hmac:" + hex.EncodeToString(m.Sum(nil))[:16]
}

// refreshAfter is when, into a lifetime, the credential is read again.
func refreshAfter(life time.Duration) time.Duration {
	f := refreshFraction + refreshJitter*(2*rand.Float64()-1)
	return time.Duration(float64(life) * f)
}

// fieldNames lists the keys of data for an error: names, not values; long ones described.
func fieldNames(data map[string]any) string {
	names := make([]string, 0, len(data))
	for k := range data {
		if len(k) > 64 {
			k = "(a name of " + strconv.Itoa(len(k)) + " bytes)"
		} else {
			k = strconv.Quote(k)
		}
		names = append(names, k)
	}
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
