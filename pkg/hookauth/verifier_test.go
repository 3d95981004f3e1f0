package hookauth_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/pkg/hookauth"
)

// These tests verify what egressd's own signer (internal/hooks) produces, so that the
// signer and the verifier are tested against each other, and against a third-party JWT
// library.

const aud = "https://policy.example.com"

var (
	match = hooks.Match{Group: "security-gate", Event: hooks.EventPre, Timeout: 10 * time.Second,
		URL: aud + "/hooks/pre", Audience: aud}
	body = []byte(`{"tool_call":{"name":"code_execution","args":{"code":"ls"}}}`)
	t0   = time.Unix(1_800_000_000, 0)
)

// world is a signer whose JWKS is served over HTTP, as egressd's admin listener does.
type world struct {
	key     ed25519.PrivateKey
	signer  *hooks.Signer
	jwks    *httptest.Server
	fetches atomic.Int32
	now     time.Time
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{now: t0, key: newKey(t)}
	var err error
	if w.signer, err = hooks.NewSigner(w.key); err != nil {
		t.Fatal(err)
	}
	w.jwks = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.fetches.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		rw.Write(w.signer.JWKS())
	}))
	t.Cleanup(w.jwks.Close)
	return w
}

func newSigner(t *testing.T) *hooks.Signer {
	t.Helper()
	s, err := hooks.NewSigner(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (w *world) verifier(t *testing.T, mod ...func(*hookauth.Options)) *hookauth.Verifier {
	t.Helper()
	o := hookauth.Options{Audience: aud, Env: "env_demo", JWKSURL: w.jwks.URL, Now: func() time.Time { return w.now }}
	for _, m := range mod {
		m(&o)
	}
	v, err := hookauth.NewVerifier(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// sign signs the claims of a call to match at t0 (before any mutation).
func sign(t *testing.T, s signer, mutate ...func(*hookauth.Claims)) string {
	t.Helper()
	c := hooks.NewClaims(match, "env_demo", hookauth.IdentListener, body, t0)
	for _, m := range mutate {
		m(&c)
	}
	jws, err := s.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return jws
}

func TestRoundTrip(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t)
	c, err := v.Verify(t.Context(), sign(t, w.signer), body)
	if err != nil {
		t.Fatal(err)
	}
	want := hookauth.Claims{Issuer: "egressd", Audience: aud, Env: "env_demo", Group: "security-gate",
		Event: "pre_tool_execution", BodySHA256: hookauth.BodySHA256(body), IssuedAt: t0.Unix(),
		Expiry: t0.Unix() + 60, ID: c.ID, Ident: "listener"}
	if *c != want {
		t.Errorf("claims %+v\nwant %+v", *c, want)
	}
}

// Any JWT library can verify the assertion: golang-jwt with the JWKS's public key.
func TestThirdPartyJWTLibrary(t *testing.T) {
	w := newWorld(t)
	jws := sign(t, w.signer, func(c *hookauth.Claims) {
		now := time.Now()
		c.IssuedAt, c.Expiry = now.Unix(), now.Add(time.Minute).Unix()
	})
	keys, err := hookauth.ParseJWKS(w.signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Parse(jws, func(tok *jwt.Token) (any, error) {
		k, ok := keys[tok.Header["kid"].(string)]
		if !ok {
			return nil, errors.New("unknown kid")
		}
		return k, nil
	}, jwt.WithValidMethods([]string{"EdDSA"}), jwt.WithAudience(aud), jwt.WithIssuer("egressd"),
		jwt.WithExpirationRequired(), jwt.WithIssuedAt())
	if err != nil {
		t.Fatalf("golang-jwt: %v", err)
	}
	claims := tok.Claims.(jwt.MapClaims)
	if claims["body_sha256"] != hookauth.BodySHA256(body) || claims["group"] != "security-gate" || claims["ident"] != "listener" {
		t.Errorf("claims %v", claims)
	}
	// golang-jwt refuses a forged one too.
	forged := sign(t, newSignerWithKid(t, tok.Header["kid"].(string)))
	if _, err := jwt.Parse(forged, func(*jwt.Token) (any, error) { return keys[tok.Header["kid"].(string)], nil },
		jwt.WithValidMethods([]string{"EdDSA"})); err == nil {
		t.Error("golang-jwt accepted a forged signature")
	}
}

func TestRejections(t *testing.T) {
	w := newWorld(t)
	kid, _ := w.signer.KeyID()
	good := sign(t, w.signer)
	for _, tc := range []struct {
		name      string
		assertion string
		body      []byte
		now       time.Time
		want      error
	}{
		{"missing", "", body, t0, hookauth.ErrMissing},
		{"not a JWS", "abc", body, t0, hookauth.ErrMalformed},
		{"forged signature (other key, same kid)", sign(t, newSignerWithKid(t, kid)), body, t0, hookauth.ErrSignature},
		{"payload swapped", swapPayload(t, good, `{"iss":"egressd"}`), body, t0, hookauth.ErrSignature},
		{"alg none", unsigned(t, "none", kid, good), body, t0, hookauth.ErrAlgorithm},
		{"alg HS256 keyed with the public key", hs256(t, kid, good, w), body, t0, hookauth.ErrAlgorithm},
		{"alg RS256", unsigned(t, "RS256", kid, good), body, t0, hookauth.ErrAlgorithm},
		{"unknown kid", sign(t, newSigner(t)), body, t0, hookauth.ErrUnknownKey},
		{"wrong aud", sign(t, w.signer, func(c *hookauth.Claims) { c.Audience = "https://evil.example.com" }), body, t0, hookauth.ErrAudience},
		{"aud with path", sign(t, w.signer, func(c *hookauth.Claims) { c.Audience = aud + "/hooks/pre" }), body, t0, hookauth.ErrAudience},
		{"wrong issuer", signRaw(t, w, `"iss":"someone"`), body, t0, hookauth.ErrIssuer},
		{"wrong env", sign(t, w.signer, func(c *hookauth.Claims) { c.Env = "env_other" }), body, t0, hookauth.ErrEnv},
		{"expired", good, body, t0.Add(66 * time.Second), hookauth.ErrExpired},
		{"issued in the future", good, body, t0.Add(-10 * time.Second), hookauth.ErrNotYetValid},
		{"body changed after signing", good, []byte(`{"tool_call":{"name":"code_execution","args":{"code":"rm -rf /"}}}`), t0, hookauth.ErrBodyMismatch},
		{"aud as a list", signRaw(t, w, `"aud":["`+aud+`"]`), body, t0, hookauth.ErrMalformed},
		{"no jti", signRaw(t, w, `"jti":""`), body, t0, hookauth.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.now = tc.now
			_, err := w.verifier(t).Verify(t.Context(), tc.assertion, tc.body)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWithinLeeway(t *testing.T) {
	w := newWorld(t)
	for _, now := range []time.Time{t0.Add(64 * time.Second), t0.Add(-4 * time.Second)} {
		w.now = now
		if _, err := w.verifier(t).Verify(t.Context(), sign(t, w.signer), body); err != nil {
			t.Errorf("at %s: %v", now.Sub(t0), err)
		}
	}
}

func TestReplay(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t)
	jws := sign(t, w.signer)
	if _, err := v.Verify(t.Context(), jws, body); err != nil {
		t.Fatal(err)
	}
	_, err := v.Verify(t.Context(), jws, body)
	if !errors.Is(err, hookauth.ErrReplay) || hookauth.Code(err) != "replay" {
		t.Errorf("replay: %v", err)
	}
	// A failed verification does not burn the jti.
	other := sign(t, w.signer)
	if _, err := v.Verify(t.Context(), other, []byte("tampered")); !errors.Is(err, hookauth.ErrBodyMismatch) {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), other, body); err != nil {
		t.Errorf("after a failed attempt: %v", err)
	}
}

func TestReplayCacheBounded(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, func(o *hookauth.Options) { o.ReplayCacheSize = 2 })
	for range 2 {
		if _, err := v.Verify(t.Context(), sign(t, w.signer), body); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Verify(t.Context(), sign(t, w.signer), body); !errors.Is(err, hookauth.ErrReplayCacheFull) {
		t.Errorf("full cache: %v, want ErrReplayCacheFull (fail closed)", err)
	}
	w.now = t0.Add(2 * time.Minute) // the first two have expired and are forgotten
	fresh := sign(t, w.signer, func(c *hookauth.Claims) { c.IssuedAt, c.Expiry = w.now.Unix(), w.now.Unix()+60 })
	if _, err := v.Verify(t.Context(), fresh, body); err != nil {
		t.Errorf("after expiry: %v", err)
	}
}

// Rotation: the verifier has the old JWKS cached; a new kid triggers one refetch, and the
// previous key, still in egressd's JWKS, keeps verifying.
func TestRotation(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t)
	before := sign(t, w.signer)
	beforeToo := sign(t, w.signer)
	if _, err := v.Verify(t.Context(), before, body); err != nil {
		t.Fatal(err)
	}
	if err := w.signer.RotateNow(newKey(t)); err != nil {
		t.Fatal(err)
	}
	newKid := sign(t, w.signer)
	if _, err := v.Verify(t.Context(), newKid, body); !errors.Is(err, hookauth.ErrUnknownKey) {
		t.Fatalf("new kid within RefetchInterval of the last fetch: %v, want ErrUnknownKey", err)
	}
	w.now = w.now.Add(hookauth.DefaultRefetchInterval)
	if _, err := v.Verify(t.Context(), newKid, body); err != nil {
		t.Fatalf("new key: %v", err)
	}
	if _, err := v.Verify(t.Context(), beforeToo, body); err != nil {
		t.Errorf("previous key during rotation: %v", err)
	}
	if n := w.fetches.Load(); n != 2 {
		t.Errorf("%d JWKS fetches, want 2 (first use, then the new kid)", n)
	}
}

func TestUnknownKidRefetchIsRateLimited(t *testing.T) {
	w := newWorld(t)
	v := w.verifier(t, func(o *hookauth.Options) { o.RefetchInterval = time.Minute })
	for range 5 {
		if _, err := v.Verify(t.Context(), sign(t, newSigner(t)), body); !errors.Is(err, hookauth.ErrUnknownKey) {
			t.Fatalf("%v", err)
		}
	}
	if n := w.fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 5 unknown kids within the interval, want 1", n)
	}
	w.now = w.now.Add(2 * time.Minute)
	v.Verify(t.Context(), sign(t, newSigner(t)), body)
	if n := w.fetches.Load(); n != 2 {
		t.Errorf("%d fetches after the interval, want 2", n)
	}
}

func TestJWKSUnavailable(t *testing.T) {
	w := newWorld(t)
	w.jwks.Close()
	_, err := w.verifier(t).Verify(t.Context(), sign(t, w.signer), body)
	if !errors.Is(err, hookauth.ErrKeysUnavailable) {
		t.Errorf("%v", err)
	}
}

func TestStaticKeys(t *testing.T) {
	w := newWorld(t)
	keys, err := hookauth.ParseJWKS(w.signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	v, err := hookauth.NewVerifier(hookauth.Options{Audience: aud, Keys: keys, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(t.Context(), sign(t, w.signer), body); err != nil {
		t.Error(err)
	}
	if w.fetches.Load() != 0 {
		t.Error("static keys fetched a JWKS")
	}
}

func TestNewVerifierOptions(t *testing.T) {
	if _, err := hookauth.NewVerifier(hookauth.Options{JWKSURL: "http://x"}); err == nil {
		t.Error("no audience accepted")
	}
	if _, err := hookauth.NewVerifier(hookauth.Options{Audience: aud}); err == nil {
		t.Error("no key source accepted")
	}
}

func TestOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"https://policy.example.com/hooks/pre?x=1": "https://policy.example.com",
		"HTTPS://Policy.Example.COM:443/":          "https://policy.example.com",
		"http://policy.example.com:80":             "http://policy.example.com",
		"http://policy.example.com:443/x":          "http://policy.example.com:443",
		"https://u:p@policy.example.com:8443/x":    "https://policy.example.com:8443",
		"http://[2001:DB8::1]/x":                   "http://[2001:db8::1]",
		"http://[2001:db8::1]:8080/x":              "http://[2001:db8::1]:8080",
	} {
		if got, err := hookauth.Origin(in); err != nil || got != want {
			t.Errorf("Origin(%s) = %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"/relative", "ftp://x/", "https://", "::"} {
		if _, err := hookauth.Origin(bad); err == nil {
			t.Errorf("Origin(%q) accepted", bad)
		}
	}
}

func TestParseJWKS(t *testing.T) {
	x := base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	keys, err := hookauth.ParseJWKS([]byte(`{"keys":[
		{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"},
		{"kty":"OKP","crv":"X25519","kid":"x","x":"` + x + `"},
		{"kty":"OKP","crv":"Ed25519","kid":"enc","use":"enc","x":"` + x + `"},
		{"kty":"OKP","crv":"Ed25519","x":"` + x + `"},
		{"kty":"OKP","crv":"Ed25519","kid":"good","alg":"EdDSA","use":"sig","x":"` + x + `"}]}`))
	if err != nil || len(keys) != 1 || keys["good"] == nil {
		t.Errorf("%v %v", keys, err)
	}
	for _, bad := range []string{`[]`, `{"keys":[]}`, `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"k","x":"AAAA"}]}`} {
		if _, err := hookauth.ParseJWKS([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// newSignerWithKid signs with a fresh key but claims kid: a forgery.
func newSignerWithKid(t *testing.T, kid string) *forger {
	return &forger{key: newKey(t), kid: kid}
}

type forger struct {
	key ed25519.PrivateKey
	kid string
}

// signer is what sign needs; *hooks.Signer and *forger have it.
type signer interface {
	Sign(hookauth.Claims) (string, error)
}

func (f *forger) Sign(c hookauth.Claims) (string, error) {
	payload, _ := json.Marshal(c)
	return compact(map[string]string{"alg": "EdDSA", "kid": f.kid}, payload, func(in []byte) []byte {
		return ed25519.Sign(f.key, in)
	}), nil
}

func compact(header map[string]string, payload []byte, sig func([]byte) []byte) string {
	h, _ := json.Marshal(header)
	in := b64(h) + "." + b64(payload)
	return in + "." + b64(sig([]byte(in)))
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func payloadOf(t *testing.T, jws string) []byte {
	t.Helper()
	p, err := base64.RawURLEncoding.DecodeString(strings.Split(jws, ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// unsigned re-labels good's claims with alg and no signature.
func unsigned(t *testing.T, alg, kid, good string) string {
	return compact(map[string]string{"alg": alg, "kid": kid}, payloadOf(t, good), func([]byte) []byte { return nil })
}

// hs256 is the classic key-confusion forgery: HMAC keyed with the public key.
func hs256(t *testing.T, kid, good string, w *world) string {
	keys, _ := hookauth.ParseJWKS(w.signer.JWKS())
	return compact(map[string]string{"alg": "HS256", "kid": kid}, payloadOf(t, good), func(in []byte) []byte {
		m := hmac.New(sha256.New, keys[kid])
		m.Write(in)
		return m.Sum(nil)
	})
}

// swapPayload keeps good's header and signature around another payload.
func swapPayload(t *testing.T, good, payload string) string {
	parts := strings.Split(good, ".")
	return parts[0] + "." + b64([]byte(payload)) + "." + parts[2]
}

// signRaw signs the claims of sign with one member replaced by raw JSON, with the
// world's real key and kid, to test claim checks the signer itself would refuse.
func signRaw(t *testing.T, w *world, member string) string {
	t.Helper()
	kid, _ := w.signer.KeyID()
	payload, _ := json.Marshal(hooks.NewClaims(match, "env_demo", hookauth.IdentListener, body, t0))
	var m map[string]json.RawMessage
	json.Unmarshal(payload, &m)
	k, v, _ := strings.Cut(member, ":")
	m[strings.Trim(k, `"`)] = json.RawMessage(v)
	payload, _ = json.Marshal(m)
	return compact(map[string]string{"alg": "EdDSA", "kid": kid}, payload, func(in []byte) []byte {
		return ed25519.Sign(w.key, in)
	})
}
