package hooks

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/credential/file"
	"github.com/egressd/egressd/pkg/hookauth"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyPEM(t testing.TB, k ed25519.PrivateKey) string {
	t.Helper()
	b, err := MarshalKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var testMatch = Match{Group: "security-gate", Event: EventPre, Timeout: 10 * time.Second,
	URL: "https://policy.example.com/hooks/pre", Audience: "https://policy.example.com"}

// verify checks an assertion with pkg/hookauth against the signer's JWKS.
func verify(t *testing.T, s *Signer, jws string, body []byte) (*hookauth.Claims, error) {
	t.Helper()
	keys, err := hookauth.ParseJWKS(s.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	v, err := hookauth.NewVerifier(hookauth.Options{Audience: testMatch.Audience, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return v.Verify(t.Context(), jws, body)
}

func TestNewClaims(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"tool_call":{"name":"code_execution"}}`)
	c := NewClaims(testMatch, "env_demo", hookauth.IdentListener, body, now)
	want := hookauth.Claims{Issuer: "egressd", Audience: "https://policy.example.com", Env: "env_demo",
		Group: "security-gate", Event: "pre_tool_execution", BodySHA256: hookauth.BodySHA256(body),
		IssuedAt: now.Unix(), Expiry: now.Unix() + 60, ID: c.ID, Ident: "listener"}
	if c != want {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
	if len(c.ID) != 22 || strings.ContainsAny(c.ID, "+/=") {
		t.Errorf("jti %q is not 128 bits base64url", c.ID)
	}
	if c2 := NewClaims(testMatch, "env_demo", hookauth.IdentURL, body, now); c2.ID == c.ID || c2.Ident != "url" {
		t.Errorf("second claims: %+v", c2)
	}
}

func TestSignHeaderAndJWKS(t *testing.T) {
	s, err := NewSigner(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.SignCall(testMatch, "env_demo", hookauth.IdentListener, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	hdr := decodeSegment(t, jws, 0)
	kid, _ := s.KeyID()
	if hdr["alg"] != "EdDSA" || hdr["kid"] != kid || hdr["typ"] != "JWT" || len(hdr) != 3 {
		t.Errorf("header %v", hdr)
	}
	var set struct{ Keys []map[string]string }
	if err := json.Unmarshal(s.JWKS(), &set); err != nil || len(set.Keys) != 1 {
		t.Fatalf("JWKS %s: %v", s.JWKS(), err)
	}
	k := set.Keys[0]
	if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["kid"] != kid || k["alg"] != "EdDSA" || k["use"] != "sig" || k["d"] != "" {
		t.Errorf("JWK %v", k)
	}
	if _, err := verify(t, s, jws, []byte("{}")); err != nil {
		t.Errorf("verify: %v", err)
	}
}

// The kid is the RFC 7638 thumbprint: RFC 8037 appendix A.3 gives it for its example key.
func TestKeyIDIsRFC7638Thumbprint(t *testing.T) {
	seed := []byte{0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec, 0x2c, 0xc4,
		0x44, 0x49, 0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03, 0x1c, 0xae, 0x7f, 0x60}
	s, err := NewSigner(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	if kid, _ := s.KeyID(); kid != "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k" {
		t.Errorf("kid %s", kid)
	}
}

func TestSignRefusesIncompleteClaims(t *testing.T) {
	s, _ := NewSigner(newKey(t))
	good := NewClaims(testMatch, "e", hookauth.IdentListener, nil, time.Now())
	for _, mutate := range []func(*hookauth.Claims){
		func(c *hookauth.Claims) { c.Issuer = "" },
		func(c *hookauth.Claims) { c.Audience = "" },
		func(c *hookauth.Claims) { c.ID = "" },
		func(c *hookauth.Claims) { c.Expiry = c.IssuedAt },
	} {
		c := good
		mutate(&c)
		if _, err := s.Sign(c); err == nil {
			t.Errorf("signed %+v", c)
		}
	}
}

// fakeClock is a Signer clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func withClock(s *Signer) *fakeClock {
	c := &fakeClock{t: time.Now()}
	s.now = c.now
	return c
}

func TestRotateKeepsPreviousKey(t *testing.T) {
	s, _ := NewSigner(newKey(t))
	clock := withClock(s)
	old, _ := s.SignCall(testMatch, "e", hookauth.IdentListener, nil)
	oldKid, _ := s.KeyID()
	if err := s.Rotate(newKey(t)); err != nil {
		t.Fatal(err)
	}
	if k, _ := s.KeyID(); k != oldKid {
		t.Fatal("the new key signs before it has been published for PublishAhead")
	}
	clock.add(PublishAhead)
	newKid, _ := s.KeyID()
	if newKid == oldKid {
		t.Fatal("kid unchanged after rotation")
	}
	if _, err := verify(t, s, old, nil); err != nil {
		t.Errorf("an assertion signed before the rotation: %v", err)
	}
	if ids := jwksKids(t, s); strings.Join(ids, ",") != newKid+","+oldKid {
		t.Errorf("JWKS kids %v, want current then previous", ids)
	}
	s.RotateNow(newKey(t)) // a third key within the lifetime: the first stays published
	if _, err := verify(t, s, old, nil); err != nil {
		t.Errorf("two rotations within the assertion lifetime: %v", err)
	}
	clock.add(hookauth.Lifetime + RetireSlack)
	if _, err := verify(t, s, old, nil); !errors.Is(err, hookauth.ErrUnknownKey) {
		t.Errorf("after every assertion of the first key expired: %v, want ErrUnknownKey", err)
	}
	if ids := jwksKids(t, s); len(ids) != 1 {
		t.Errorf("JWKS %v, want only the current key", ids)
	}
}

// TestRotationWithoutGap: across a rotation of a file-held key, a verifier holding the
// JWKS fetched before it (it refetches on an unknown kid, at most every
// DefaultRefetchInterval) and one fetching the new JWKS both accept every assertion,
// those signed before the switch and after. Switching at once (RotateNow) would leave
// the first verifier a window of ErrUnknownKey: that is the gap PublishAhead closes.
func TestRotationWithoutGap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hook.pem")
	if err := os.WriteFile(path, []byte(keyPEM(t, newKey(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewSignerFromConfig(config.SecretRef{File: path}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := withClock(s)
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(s.JWKS()) }))
	defer jwks.Close()
	newVerifier := func() *hookauth.Verifier {
		v, err := hookauth.NewVerifier(hookauth.Options{Audience: testMatch.Audience, JWKSURL: jwks.URL, Now: clock.now})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	sign := func() string {
		jws, err := s.Sign(NewClaims(testMatch, "e", hookauth.IdentListener, nil, clock.now()))
		if err != nil {
			t.Fatal(err)
		}
		return jws
	}
	accept := func(who string, v *hookauth.Verifier, jws string) {
		t.Helper()
		if _, err := v.Verify(t.Context(), jws, nil); err != nil {
			t.Errorf("%s: %v", who, err)
		}
	}
	holder := newVerifier()
	before := sign()
	accept("before the rotation", holder, before) // holder now holds the old JWKS
	oldKid := must(s.KeyID())

	clock.add(time.Second)
	next := newKey(t)
	os.WriteFile(path, []byte(keyPEM(t, next)), 0o600)
	os.Chtimes(path, time.Now().Add(time.Minute), time.Now().Add(time.Minute))
	s.file.mu.Lock()
	s.file.checked = time.Time{} // look at the file now rather than FileCheckInterval later
	s.file.mu.Unlock()
	published := sign()      // still the old key: the new one is only published
	fetcher := newVerifier() // fetches the new JWKS: both keys
	accept("fetcher, signed before", fetcher, before)
	accept("fetcher, signed while published", fetcher, published)

	clock.add(PublishAhead)
	after := sign()
	if must(s.KeyID()) == oldKid {
		t.Fatal("the file's new key never took over")
	}
	accept("holder, signed after the switch", holder, after)
	accept("fetcher, signed after the switch", fetcher, after)
	accept("holder, signed before", holder, published)

	// Without publishing ahead: a switch right after the holder's fetch leaves it a gap.
	gapHolder := newVerifier()
	accept("gap holder", gapHolder, sign())
	s.RotateNow(newKey(t))
	if _, err := gapHolder.Verify(t.Context(), sign(), nil); !errors.Is(err, hookauth.ErrUnknownKey) {
		t.Errorf("RotateNow within the refetch interval: %v, want the gap (ErrUnknownKey)", err)
	}
}

func jwksKids(t *testing.T, s *Signer) []string {
	var set struct{ Keys []struct{ Kid string } }
	if err := json.Unmarshal(s.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, k := range set.Keys {
		ids = append(ids, k.Kid)
	}
	return ids
}

// fakeCreds is a credential store holding one value, swapped by the test.
type fakeCreds struct {
	mu  sync.Mutex
	v   credential.Value
	err error
}

func (f *fakeCreds) Get(string) (credential.Value, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.v, f.err
}

func (f *fakeCreds) set(t *testing.T, version, token string) {
	hs, err := credential.ParseSecret("hook-signing-key", map[string]any{"token": token})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.v, f.err = credential.Value{ID: "hook-signing-key", Version: version, Headers: hs}, nil
	f.mu.Unlock()
}

func TestCredentialSignerFollowsTheStore(t *testing.T) {
	creds := &fakeCreds{err: &credential.UnavailableError{ID: "hook-signing-key", Cause: credential.CauseNeverRead}}
	s := NewCredentialSigner(creds, "hook-signing-key")
	if _, err := s.SignCall(testMatch, "e", hookauth.IdentListener, nil); !errors.Is(err, ErrNoSigningKey) {
		t.Fatalf("before the first read: %v, want ErrNoSigningKey", err)
	}
	if string(s.JWKS()) != `{"keys":[]}` {
		t.Errorf("JWKS before any key: %s", s.JWKS())
	}

	creds.set(t, "v1", keyPEM(t, newKey(t)))
	first, err := s.SignCall(testMatch, "e", hookauth.IdentListener, nil)
	if err != nil {
		t.Fatal(err)
	}
	kid1, _ := s.KeyID()

	clock := withClock(s)
	creds.set(t, "v2", keyPEM(t, newKey(t))) // rotated in the backend
	s.KeyID()
	clock.add(PublishAhead)
	kid2, _ := s.KeyID()
	if kid2 == kid1 {
		t.Fatal("the signer did not follow the rotation")
	}
	if _, err := verify(t, s, first, nil); err != nil {
		t.Errorf("previous key after rotation: %v", err)
	}

	creds.set(t, "v3", "not-a-pem-key") // a bad rotation fails closed, never signs with a stale key
	if _, err := s.SignCall(testMatch, "e", hookauth.IdentListener, nil); !errors.Is(err, ErrNoSigningKey) || strings.Contains(err.Error(), "not-a-pem-key") {
		t.Errorf("bad key: %v", err)
	}
	creds.mu.Lock()
	creds.err = &credential.UnavailableError{ID: "hook-signing-key", Cause: credential.CauseStale}
	creds.mu.Unlock()
	if _, err := s.SignCall(testMatch, "e", hookauth.IdentListener, nil); !errors.Is(err, ErrNoSigningKey) {
		t.Errorf("unavailable: %v", err)
	}
	if ids := jwksKids(t, s); len(ids) != 2 {
		t.Errorf("JWKS while unavailable: %v, want the keys known so far", ids)
	}
}

func TestCredentialSignerRefusesOtherShapes(t *testing.T) {
	hs, _ := credential.ParseSecret("k", map[string]any{"headers": map[string]any{"X-Api-Key": "x"}})
	s := NewCredentialSigner(&fakeCreds{v: credential.Value{ID: "k", Version: "1", Headers: hs}}, "k")
	if _, err := s.KeyID(); !errors.Is(err, ErrNoSigningKey) || !strings.Contains(err.Error(), `{"token"`) {
		t.Errorf("%v", err)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	k1, path, created, err := LoadOrCreateKey(dir)
	if err != nil || !created || path != filepath.Join(dir, KeyFileName) {
		t.Fatalf("first start: %v %v %s", err, created, path)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode %v, want 0700", di.Mode().Perm())
	}
	k2, _, created, err := LoadOrCreateKey(dir)
	if err != nil || created || !k1.Equal(k2) {
		t.Errorf("second start: %v %v, same key %t", err, created, k1.Equal(k2))
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".*tmp")); len(matches) != 0 {
		t.Errorf("temp files left: %v", matches)
	}
}

func TestLoadOrCreateKeyConcurrent(t *testing.T) {
	dir := t.TempDir()
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, _, _, err := LoadOrCreateKey(dir)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("concurrent starts generated different keys")
		}
	}
}

func TestParseKeyPEM(t *testing.T) {
	k := newKey(t)
	good := keyPEM(t, k)
	if got, err := ParseKeyPEM([]byte(good)); err != nil || !got.Equal(k) {
		t.Fatalf("round trip: %v", err)
	}
	for name, data := range map[string]string{
		"empty":        "",
		"not PEM":      "hello",
		"wrong type":   strings.ReplaceAll(good, "PRIVATE KEY", "EC PRIVATE KEY"),
		"trailing key": good + good,
		"garbage DER":  "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
	} {
		if _, err := ParseKeyPEM([]byte(data)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNewSignerFromConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "key.pem")
	k := newKey(t)
	if err := os.WriteFile(file, []byte(keyPEM(t, k)), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile, err := NewSignerFromConfig(config.SecretRef{File: file}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := NewSigner(k)
	if a, _ := fromFile.KeyID(); a != must(want.KeyID()) {
		t.Error("file key not used")
	}
	gen, err := NewSignerFromConfig(config.SecretRef{}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, KeyFileName)); err != nil || must(gen.KeyID()) == "" {
		t.Errorf("generated key: %v", err)
	}
	if _, err := NewSignerFromConfig(config.SecretRef{Credential: "k"}, dir, nil); err == nil {
		t.Error("a credential key without a store")
	}
	if _, err := NewSignerFromConfig(config.SecretRef{File: filepath.Join(dir, "missing.pem")}, dir, nil); err == nil {
		t.Error("a missing key file")
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

// decodeSegment decodes segment i of a compact JWS as a JSON object.
func decodeSegment(t *testing.T, jws string, i int) map[string]any {
	t.Helper()
	seg := strings.Split(jws, ".")[i]
	raw, err := base64URL(seg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func base64URL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

// A key held as a credential, end to end through the file backend and the Store: the
// PEM's line breaks survive, and a rotation in the file reaches the signer.
func TestCredentialSignerWithFileBackend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.json")
	write := func(k ed25519.PrivateKey) {
		data, _ := json.Marshal(map[string]any{"hook-signing-key": map[string]string{"token": keyPEM(t, k)}})
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	k1, k2 := newKey(t), newKey(t)
	write(k1)
	store := credential.NewStore(file.New(path, file.Options{}), []string{"hook-signing-key"}, credential.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); store.Wait() }()
	store.Start(ctx)

	s := NewCredentialSigner(store, "hook-signing-key")
	clock := withClock(s)
	want1, _ := NewSigner(k1)
	if must(s.KeyID()) != must(want1.KeyID()) {
		t.Fatal("the signer does not use the credential's key")
	}
	write(k2)
	store.RefreshNow(ctx, "hook-signing-key")
	s.KeyID() // publishes the new key
	clock.add(PublishAhead)
	want2, _ := NewSigner(k2)
	if must(s.KeyID()) != must(want2.KeyID()) {
		t.Fatal("the signer did not follow the rotated credential")
	}
	if ids := jwksKids(t, s); len(ids) != 2 || ids[1] != must(want1.KeyID()) {
		t.Errorf("JWKS %v, want the new key then the previous", ids)
	}
}

// A node-mode call's assertion carries its sandbox, and a verifier bound to one
// sandbox refuses another's; a sidecar's carries no sandbox claim at all.
func TestSandboxClaim(t *testing.T) {
	s, err := NewSigner(newKey(t))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := hookauth.ParseJWKS(s.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ signed, want string }{{"sbx-a", "sbx-a"}, {"sbx-b", "sbx-a"}, {"", ""}} {
		jws, err := s.SignSandboxCall(testMatch, "env_demo", tc.signed, hookauth.IdentListener, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := hookauth.NewVerifier(hookauth.Options{Audience: testMatch.Audience, Keys: keys, Sandbox: tc.want})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(t.Context(), jws, nil)
		switch {
		case tc.signed == tc.want && (err != nil || c.Sandbox != tc.signed):
			t.Errorf("signed for %q: %v %+v", tc.signed, err, c)
		case tc.signed != tc.want && !errors.Is(err, hookauth.ErrSandbox):
			t.Errorf("signed for %q, verified for %q: %v, want ErrSandbox", tc.signed, tc.want, err)
		}
		if _, has := decodeSegment(t, jws, 1)["sandbox"]; has != (tc.signed != "") {
			t.Errorf("signed for %q: sandbox claim present %t", tc.signed, has)
		}
	}
}
