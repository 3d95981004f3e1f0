package hooks

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/pkg/hookauth"
)

// ErrNoSigningKey is wrapped by Sign's error when the key cannot be had: its credential
// is unavailable or does not hold a usable key. A pre-tool call then fails closed.
var ErrNoSigningKey = errors.New("hook signing key unavailable")

// Credentials is the part of credential.Store a credential-held key is read through.
type Credentials interface {
	Get(id string) (credential.Value, error)
}

// Signer signs hook assertions with an Ed25519 key and publishes the public keys as a
// JWKS. A rotation leaves no gap for any verifier:
//   - the new key is published at once and signs from PublishAhead later, so a verifier
//     holding the old JWKS meets the new kid no sooner than its refetch limit allows it to
//     fetch again (hookauth.DefaultRefetchInterval), and finds it;
//   - the replaced key stays published until the last assertion it signed has expired
//     (hookauth.Lifetime plus RetireSlack after the switch), so a verifier fetching the new
//     JWKS still accepts assertions signed before the switch.
//
// It is safe for concurrent use.
//
// A Signer from NewCredentialSigner follows the credential store: whenever the
// credential's version changes, the next Sign or JWKS parses the new key and rotates to
// it. A Signer from NewSignerFromConfig with a key file (or the generated one) follows
// the file likewise, looking at it at most every FileCheckInterval. A Signer from
// NewSigner keeps its key until Rotate.
type Signer struct {
	creds Credentials // nil: not credential-held
	id    string
	file  *keyFile // nil: not file-held
	now   func() time.Time

	mu      sync.RWMutex
	cur     *signingKey
	next    *signingKey // published, signing from nextAt; nil when none
	nextAt  time.Time
	retired []retiredKey // replaced keys still published, oldest first
	version string       // of the credential value cur came from
	badVer  string       // a credential version whose key could not be used
	badErr  error
}

// PublishAhead is how long a new key is published before it signs: a verifier's least
// time between two JWKS fetches (pkg/hookauth's default).
const PublishAhead = hookauth.DefaultRefetchInterval

// RetireSlack is how long past hookauth.Lifetime a replaced key stays in the JWKS: the
// verifiers' clock skew leeway (hookauth.DefaultLeeway) and calls still in flight.
const RetireSlack = 2 * hookauth.DefaultLeeway

// retiredKey is a replaced key, published until its last assertion has expired.
type retiredKey struct {
	k     *signingKey
	until time.Time
}

// signingKey is one key with its RFC 7638 thumbprint as kid.
type signingKey struct {
	kid  string
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
	// header is the encoded protected header, {"alg":"EdDSA","kid":…,"typ":"JWT"}:
	// the same for every assertion, so encoded once.
	header string
}

func newSigningKey(priv ed25519.PrivateKey) (*signingKey, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return nil, errors.New("hook signing key: not an Ed25519 private key")
	}
	pub := priv.Public().(ed25519.PublicKey)
	tp, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, err
	}
	kid := base64.RawURLEncoding.EncodeToString(tp)
	hdr, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}{"EdDSA", kid, "JWT"})
	if err != nil {
		return nil, err
	}
	return &signingKey{kid: kid, pub: pub, priv: priv, header: base64.RawURLEncoding.EncodeToString(hdr)}, nil
}

// sign returns the compact serialization (RFC 7515 §7.1) of a JWS over payload.
// golang-jwt's EdDSA method signs; go-jose's Signer did the same work with a
// dozen microseconds more per assertion (BenchmarkSignCall), on the path of every
// hook call.
func (k *signingKey) sign(payload []byte) (string, error) {
	signing := k.header + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig, err := jwt.SigningMethodEdDSA.Sign(signing, k.priv)
	if err != nil {
		return "", err
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// NewSigner signs with a fixed key (hooks.signing_key.file, or the generated one).
func NewSigner(key ed25519.PrivateKey) (*Signer, error) {
	k, err := newSigningKey(key)
	if err != nil {
		return nil, err
	}
	return &Signer{cur: k}, nil
}

// NewCredentialSigner signs with the key credential id holds as {"token": "<PEM>"},
// read through creds (a credential.Store that manages id) on each Sign and JWKS, from
// memory. Until the credential can be read, Sign fails with ErrNoSigningKey.
func NewCredentialSigner(creds Credentials, id string) *Signer {
	return &Signer{creds: creds, id: id}
}

// NewSignerFromConfig builds the Signer hooks.signing_key names: a credential read
// through creds, a file, or, with neither, the key generated into stateDir on first
// start (KeyFileName). A file or generated key that cannot be read is an error.
func NewSignerFromConfig(ref config.SecretRef, stateDir string, creds Credentials) (*Signer, error) {
	switch {
	case ref.Credential != "":
		if creds == nil {
			return nil, fmt.Errorf("hook signing key: credential %s needs a credential store", ref.Credential)
		}
		return NewCredentialSigner(creds, ref.Credential), nil
	case ref.File != "":
		return newFileSigner(ref.File)
	}
	_, path, _, err := LoadOrCreateKey(stateDir)
	if err != nil {
		return nil, err
	}
	return newFileSigner(path)
}

// CheckSignerConfig returns the error NewSignerFromConfig would return for ref,
// without generating a key in stateDir (a state dir without one is fine: run
// generates it). `egressd check` calls it.
func CheckSignerConfig(ref config.SecretRef, stateDir string, creds Credentials) error {
	if ref.Credential != "" || ref.File != "" {
		_, err := NewSignerFromConfig(ref, stateDir, creds)
		return err
	}
	k, _, err := LoadExistingKey(stateDir)
	if err == nil && k != nil {
		_, err = NewSigner(k)
	}
	return err
}

// Rotate publishes key in the JWKS at once and makes it the signing key PublishAhead
// later; the key it replaces stays published until its assertions have expired. Rotating
// to the current (or the pending) key changes nothing.
func (s *Signer) Rotate(key ed25519.PrivateKey) error {
	k, err := newSigningKey(key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rotateLocked(k)
	s.mu.Unlock()
	return nil
}

// RotateNow makes key the signing key at once (for verifiers that have it already, e.g.
// as a static key); the replaced key stays published until its assertions have expired.
func (s *Signer) RotateNow(key ed25519.PrivateKey) error {
	k, err := newSigningKey(key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.switchLocked(k)
	s.mu.Unlock()
	return nil
}

// rotateLocked publishes k to sign from PublishAhead on; the first key signs at once.
func (s *Signer) rotateLocked(k *signingKey) {
	switch {
	case s.cur == nil:
		s.cur = k
	case s.cur.kid == k.kid:
		s.next = nil // back to the current key before the switch
	case s.next == nil || s.next.kid != k.kid:
		s.next, s.nextAt = k, s.clock().Add(PublishAhead)
	}
}

// promoteLocked switches to the published next key once its time has come.
func (s *Signer) promoteLocked() {
	if s.next != nil && !s.clock().Before(s.nextAt) {
		s.switchLocked(s.next)
	}
}

// switchLocked makes k the signing key, retiring the current one.
func (s *Signer) switchLocked(k *signingKey) {
	if s.next != nil && s.next.kid == k.kid {
		s.next = nil
	}
	if s.cur != nil && s.cur.kid == k.kid {
		return
	}
	now := s.clock()
	kept := s.retired[:0]
	for _, r := range s.retired {
		if r.k.kid != k.kid && now.Before(r.until) {
			kept = append(kept, r)
		}
	}
	if s.cur != nil {
		kept = append(kept, retiredKey{k: s.cur, until: now.Add(hookauth.Lifetime + RetireSlack)})
	}
	s.retired, s.cur = kept, k
}

func (s *Signer) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// KeyID returns the kid of the current key.
func (s *Signer) KeyID() (string, error) {
	k, err := s.current()
	if err != nil {
		return "", err
	}
	return k.kid, nil
}

// Sign returns the compact JWS (header alg EdDSA, typ JWT, kid) over c. It refuses
// claims that miss iss, aud, jti, iat or exp, or whose exp is not after iat.
func (s *Signer) Sign(c hookauth.Claims) (string, error) {
	if c.Issuer != hookauth.Issuer || c.Audience == "" || c.ID == "" || c.IssuedAt == 0 || c.Expiry <= c.IssuedAt {
		return "", errors.New("hook assertion: incomplete claims (iss, aud, jti, iat and exp are required; use NewClaims)")
	}
	k, err := s.current()
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	jws, err := k.sign(payload)
	if err != nil {
		return "", fmt.Errorf("hook assertion: %w", err)
	}
	return jws, nil
}

// SignCall signs the claims of one call to m's hook URL: NewClaims at time.Now.
func (s *Signer) SignCall(m Match, env, ident string, body []byte) (string, error) {
	return s.SignSandboxCall(m, env, "", ident, body)
}

// SignSandboxCall is SignCall for a call that arrived on a node-mode sandbox's
// listener: the claims carry the sandbox's ID ("" for none, as in a sidecar).
func (s *Signer) SignSandboxCall(m Match, env, sandbox, ident string, body []byte) (string, error) {
	c := NewClaims(m, env, ident, body, time.Now())
	c.Sandbox = sandbox
	return s.Sign(c)
}

// JWKS returns the public keys, current first, then the replaced keys whose assertions
// may still be valid, newest first, as a JSON Web Key Set (RFC 7517, keys per RFC 8037:
// kty OKP, crv Ed25519, with kid, use sig and alg EdDSA), for /.well-known/jwks.json.
// With no key yet it is {"keys":[]}.
func (s *Signer) JWKS() []byte {
	_, _ = s.current() // follow the credential or file; the keys known so far are served either way
	now := s.clock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	keys := []*signingKey{s.cur, s.next}
	for i := len(s.retired) - 1; i >= 0; i-- {
		if now.Before(s.retired[i].until) {
			keys = append(keys, s.retired[i].k)
		}
	}
	for _, k := range keys {
		if k != nil {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.pub, KeyID: k.kid, Algorithm: string(jose.EdDSA), Use: "sig"})
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		return []byte(`{"keys":[]}`) // unreachable: Ed25519 public keys always marshal
	}
	return b
}

// current returns the key to sign with, first following the credential when there is one.
func (s *Signer) current() (*signingKey, error) {
	if s.creds != nil {
		if err := s.follow(); err != nil {
			return nil, err
		}
	}
	if s.file != nil {
		if err := s.followFile(); err != nil {
			return nil, err
		}
	}
	s.mu.RLock()
	due := s.next != nil && !s.clock().Before(s.nextAt)
	s.mu.RUnlock()
	if due {
		s.mu.Lock()
		s.promoteLocked()
		s.mu.Unlock()
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.cur == nil {
		return nil, ErrNoSigningKey
	}
	return s.cur, nil
}

// follow reads the credential from memory and rotates when its version changed. A
// version whose key is unusable is remembered, so it is parsed once, not per call.
func (s *Signer) follow() error {
	v, err := s.creds.Get(s.id)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoSigningKey, err)
	}
	s.mu.RLock()
	same, bad, badErr := v.Version == s.version && s.cur != nil, v.Version == s.badVer, s.badErr
	s.mu.RUnlock()
	switch {
	case same:
		return nil
	case bad:
		return badErr
	}
	k, err := keyOf(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.badVer, s.badErr = v.Version, err
		return err
	}
	s.rotateLocked(k)
	s.version = v.Version
	return nil
}

// keyOf parses the PEM key a credential value holds as its token.
func keyOf(v credential.Value) (*signingKey, error) {
	tok, ok := v.Token()
	if !ok {
		return nil, fmt.Errorf(`%w: credential %s is not {"token": "<PEM PKCS#8 Ed25519 key>"}`, ErrNoSigningKey, v.ID)
	}
	priv, err := ParseKeyPEM([]byte(tok))
	if err != nil {
		return nil, fmt.Errorf("%w: credential %s version %s: %v", ErrNoSigningKey, v.ID, v.Version, err)
	}
	return newSigningKey(priv)
}

// NewClaims returns the claims of one hook call: iss egressd, aud m.Audience, env,
// m's group and event, the SHA-256 of body (the exact bytes forwarded upstream), iat
// now and exp now+60 s, a random 128-bit jti, and ident: how egressd knew the call
// was the runtime's (hookauth.IdentListener, IdentRuntimeAuth or IdentURL).
func NewClaims(m Match, env, ident string, body []byte, now time.Time) hookauth.Claims {
	return hookauth.Claims{
		Issuer:     hookauth.Issuer,
		Audience:   m.Audience,
		Env:        env,
		Group:      m.Group,
		Event:      m.Event,
		BodySHA256: hookauth.BodySHA256(body),
		IssuedAt:   now.Unix(),
		Expiry:     now.Add(hookauth.Lifetime).Unix(),
		ID:         newJTI(),
		Ident:      ident,
	}
}

// newJTI returns 128 random bits, base64url. crypto/rand.Read never fails (Go 1.24+).
func newJTI() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
