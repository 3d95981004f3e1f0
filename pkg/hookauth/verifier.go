package hookauth

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Defaults of Options, taken by zero values.
const (
	// DefaultLeeway is the clock skew allowed on iat and exp.
	DefaultLeeway = 5 * time.Second
	// DefaultRefetchInterval is the least time between two JWKS fetches: an assertion
	// with an unknown kid triggers a fetch at most this often, so forged kids cannot
	// turn the endpoint into a load generator against egressd's admin listener. The
	// cost: right after egressd rotates its key, an assertion with the new kid that
	// arrives within this interval of the last fetch fails with ErrUnknownKey.
	DefaultRefetchInterval = 5 * time.Second
	// DefaultMaxKeyAge is how long fetched keys are used before the JWKS is fetched
	// again (on the next Verify); when that fetch fails the cached keys stay in use.
	DefaultMaxKeyAge = 10 * time.Minute
	// DefaultReplayCacheSize bounds the jti cache: at one entry per assertion for
	// Lifetime plus Leeway, 100000 covers about 1500 hook calls a second. When it is
	// full of live entries Verify fails with ErrReplayCacheFull.
	DefaultReplayCacheSize = 100_000
	// DefaultMaxBodyBytes bounds the body Middleware reads; egressd's own bound
	// (limits.hook_body_bytes) defaults to the same 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
	// defaultFetchTimeout bounds one JWKS fetch with the default client.
	defaultFetchTimeout = 10 * time.Second
	// maxAssertionBytes bounds the header value before any decoding.
	maxAssertionBytes = 8 << 10
)

// Options configure a Verifier. Audience and a key source (JWKSURL or Keys) are required.
type Options struct {
	// Audience is the endpoint's origin, exactly as egressd computes it from the hook
	// URL in hooks.json: use Origin. Required.
	Audience string
	// Env, when set, must equal the assertion's env claim (egressd's environment ID).
	Env string
	// Sandbox, when set, must equal the assertion's sandbox claim (a node-mode
	// egressd's sandbox ID): an endpoint serving one sandbox refuses the others'.
	Sandbox string
	// JWKSURL is egressd's JWKS, e.g. http://127.0.0.1:15000/.well-known/jwks.json.
	// Keys are fetched on first use, again when a kid is unknown (at most every
	// RefetchInterval) and when older than MaxKeyAge.
	JWKSURL string
	// Keys are static keys by kid (see ParseJWKS), used with or without JWKSURL.
	Keys map[string]ed25519.PublicKey
	// HTTPClient fetches the JWKS; default a client with a 10 s timeout.
	HTTPClient *http.Client
	// RefetchInterval: default DefaultRefetchInterval (30 s).
	RefetchInterval time.Duration
	// MaxKeyAge: default DefaultMaxKeyAge (10 min).
	MaxKeyAge time.Duration
	// Leeway is the clock skew allowed on iat and exp; default DefaultLeeway (5 s).
	Leeway time.Duration
	// ReplayCacheSize: default DefaultReplayCacheSize.
	ReplayCacheSize int
	// MaxBodyBytes bounds the body Middleware reads; default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Now is the clock; default time.Now (tests set it).
	Now func() time.Time
}

// Verifier checks egressd's hook assertions. It is safe for concurrent use.
type Verifier struct {
	o      Options
	replay *replayCache

	mu        sync.Mutex // guards keys, fetchedAt, triedAt
	keys      map[string]ed25519.PublicKey
	fetchedAt time.Time // of the last good fetch
	triedAt   time.Time // of the last fetch attempt
	fetchMu   sync.Mutex
}

// NewVerifier checks o and applies its defaults.
func NewVerifier(o Options) (*Verifier, error) {
	switch {
	case o.Audience == "":
		return nil, errors.New("hookauth: Options.Audience is required (the endpoint's origin; see Origin)")
	case o.JWKSURL == "" && len(o.Keys) == 0:
		return nil, errors.New("hookauth: set Options.JWKSURL or Options.Keys")
	}
	o = o.withDefaults()
	return &Verifier{o: o, replay: newReplayCache(o.ReplayCacheSize), keys: maps.Clone(o.Keys)}, nil
}

func (o Options) withDefaults() Options {
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: defaultFetchTimeout}
	}
	if o.RefetchInterval <= 0 {
		o.RefetchInterval = DefaultRefetchInterval
	}
	if o.MaxKeyAge <= 0 {
		o.MaxKeyAge = DefaultMaxKeyAge
	}
	if o.Leeway <= 0 {
		o.Leeway = DefaultLeeway
	}
	if o.ReplayCacheSize <= 0 {
		o.ReplayCacheSize = DefaultReplayCacheSize
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// header is the JWS protected header, read before the signature is checked so that the
// algorithm and key can be refused with a precise error.
type header struct {
	Alg  string          `json:"alg"`
	Kid  string          `json:"kid"`
	Crit json.RawMessage `json:"crit"`
}

// Verify checks assertion (the Egressd-Hook-Assertion header value) against body, the
// request body exactly as received, and returns its claims. Checks, in order: compact
// JWS with alg EdDSA (none, HS*, RS* ... are refused), a known kid, the signature, iss
// "egressd", aud equal to Options.Audience, env (when Options.Env is set), iat and exp
// within Leeway, body_sha256 equal to the SHA-256 of body, and a jti not seen before
// (ErrReplay). Every error wraps one of the Err values.
func (v *Verifier) Verify(ctx context.Context, assertion string, body []byte) (*Claims, error) {
	if assertion == "" {
		return nil, ErrMissing
	}
	h, err := parseHeader(assertion)
	if err != nil {
		return nil, err
	}
	key, err := v.key(ctx, h.Kid)
	if err != nil {
		return nil, err
	}
	payload, err := verifySignature(assertion, key)
	if err != nil {
		return nil, err
	}
	c, err := decodeClaims(payload)
	if err != nil {
		return nil, err
	}
	if err := v.check(c, body); err != nil {
		return nil, err
	}
	until := c.Expiry + int64(v.o.Leeway/time.Second) + 1
	if err := v.replay.add(c.ID, until, v.o.Now().Unix()); err != nil {
		return nil, err
	}
	return c, nil
}

// parseHeader decodes the protected header of a compact JWS and checks alg and kid.
func parseHeader(assertion string) (header, error) {
	var h header
	if len(assertion) > maxAssertionBytes || strings.Count(assertion, ".") != 2 {
		return h, fmt.Errorf("%w: not a compact JWS", ErrMalformed)
	}
	seg, _, _ := strings.Cut(assertion, ".")
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil || json.Unmarshal(raw, &h) != nil {
		return h, fmt.Errorf("%w: unreadable JWS header", ErrMalformed)
	}
	switch {
	case h.Alg != Algorithm:
		return h, fmt.Errorf("%w: alg %q", ErrAlgorithm, h.Alg)
	case h.Kid == "":
		return h, fmt.Errorf("%w: no kid in the JWS header", ErrUnknownKey)
	case h.Crit != nil:
		return h, fmt.Errorf("%w: crit header not supported", ErrMalformed)
	}
	return h, nil
}

// verifySignature checks the JWS signature with key and returns the payload.
func verifySignature(assertion string, key ed25519.PublicKey) ([]byte, error) {
	jws, err := jose.ParseSignedCompact(assertion, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	payload, err := jws.Verify(key)
	if err != nil {
		return nil, ErrSignature
	}
	return payload, nil
}

// decodeClaims decodes the payload; every claim must have its JSON type (aud one string).
func decodeClaims(payload []byte) (*Claims, error) {
	var c Claims
	if err := json.NewDecoder(bytes.NewReader(payload)).Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrMalformed, err)
	}
	if c.ID == "" || c.Expiry == 0 || c.IssuedAt == 0 {
		return nil, fmt.Errorf("%w: jti, iat and exp are required", ErrMalformed)
	}
	return &c, nil
}

// check applies the claim checks that need no state.
func (v *Verifier) check(c *Claims, body []byte) error {
	now, leeway := v.o.Now(), v.o.Leeway
	switch {
	case c.Issuer != Issuer:
		return fmt.Errorf("%w: %q", ErrIssuer, c.Issuer)
	case c.Audience != v.o.Audience:
		return fmt.Errorf("%w: %q, want %q", ErrAudience, c.Audience, v.o.Audience)
	case v.o.Env != "" && c.Env != v.o.Env:
		return fmt.Errorf("%w: %q, want %q", ErrEnv, c.Env, v.o.Env)
	case v.o.Sandbox != "" && c.Sandbox != v.o.Sandbox:
		return fmt.Errorf("%w: %q, want %q", ErrSandbox, c.Sandbox, v.o.Sandbox)
	case now.After(time.Unix(c.Expiry, 0).Add(leeway)):
		return fmt.Errorf("%w at %s", ErrExpired, time.Unix(c.Expiry, 0).UTC().Format(time.RFC3339))
	case time.Unix(c.IssuedAt, 0).After(now.Add(leeway)):
		return fmt.Errorf("%w: iat %s", ErrNotYetValid, time.Unix(c.IssuedAt, 0).UTC().Format(time.RFC3339))
	case c.BodySHA256 != BodySHA256(body):
		return ErrBodyMismatch
	}
	return nil
}

// key returns the public key for kid, fetching the JWKS when the kid is unknown or the
// fetched keys are older than MaxKeyAge, at most every RefetchInterval.
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	k, ok, due := v.cached(kid)
	if ok && !due {
		return k, nil
	}
	if v.o.JWKSURL == "" {
		return nil, fmt.Errorf("%w: %q", ErrUnknownKey, kid)
	}
	ferr := v.refresh(ctx)
	if k, ok, _ = v.cached(kid); ok {
		return k, nil
	}
	if ferr != nil {
		return nil, fmt.Errorf("%w: %v", ErrKeysUnavailable, ferr)
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownKey, kid)
}

// cached returns the key for kid and whether a fetch is due.
func (v *Verifier) cached(kid string) (ed25519.PublicKey, bool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k, ok := v.keys[kid]
	due := v.o.JWKSURL != "" && v.o.Now().Sub(v.fetchedAt) > v.o.MaxKeyAge
	return k, ok, due
}

// refresh fetches the JWKS unless a fetch was tried within RefetchInterval; concurrent
// callers share one fetch. The static Keys stay known whatever the JWKS says.
func (v *Verifier) refresh(ctx context.Context) error {
	v.fetchMu.Lock()
	defer v.fetchMu.Unlock()
	v.mu.Lock()
	recent := !v.triedAt.IsZero() && v.o.Now().Sub(v.triedAt) < v.o.RefetchInterval
	if !recent {
		v.triedAt = v.o.Now()
	}
	v.mu.Unlock()
	if recent {
		return nil
	}
	keys, err := fetchJWKS(ctx, v.o.HTTPClient, v.o.JWKSURL)
	if err != nil {
		return err
	}
	maps.Copy(keys, v.o.Keys)
	v.mu.Lock()
	v.keys, v.fetchedAt = keys, v.o.Now()
	v.mu.Unlock()
	return nil
}
