package vault

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
)

// Scenarios against a real Vault: the in-memory dev server scripts/vaultdev.sh starts
// (make test exports VAULT_ADDR and VAULT_TOKEN, a root token). Each test makes its own
// KV prefix, policies, roles and auth mounts, named after it, and only talks to 127.0.0.1.
// Without VAULT_ADDR they skip, unless EGRESSD_REQUIRE_VAULT=1, when they fail. They run
// in parallel, except the one that sets the environment.

// devVault is the Vault under test and a root client for setting it up.
type devVault struct {
	t    *testing.T
	addr string
	root *api.Client
	name string // unique per test: a KV prefix, policy, role and mount name
}

func newDevVault(t *testing.T) *devVault {
	t.Helper()
	addr := os.Getenv("VAULT_ADDR")
	if addr == "" {
		if os.Getenv("EGRESSD_REQUIRE_VAULT") == "1" {
			t.Fatal("EGRESSD_REQUIRE_VAULT=1 but VAULT_ADDR is unset: start a Vault with scripts/vaultdev.sh start and export what it prints")
		}
		t.Skip("VAULT_ADDR is unset: skipping the Vault integration test (make test starts a Vault; or eval $(scripts/vaultdev.sh start))")
	}
	if u, err := url.Parse(addr); err != nil || u.Hostname() != "127.0.0.1" {
		t.Fatalf("VAULT_ADDR=%s: the tests only talk to a Vault on 127.0.0.1", addr)
	}
	if os.Getenv("VAULT_TOKEN") == "" {
		t.Fatal("VAULT_ADDR is set but VAULT_TOKEN is not: the tests need the dev server's root token")
	}
	cfg := api.DefaultConfig()
	cfg.Address = addr
	root, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	root.SetToken(os.Getenv("VAULT_TOKEN"))
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), time.Now().UnixNano()%1e6)
	return &devVault{t: t, addr: addr, root: root, name: name}
}

func (v *devVault) write(path string, data map[string]any) *api.Secret {
	v.t.Helper()
	s, err := v.root.Logical().Write(path, data)
	if err != nil {
		v.t.Fatalf("write %s: %v", path, err)
	}
	return s
}

func (v *devVault) read(path string) *api.Secret {
	v.t.Helper()
	s, err := v.root.Logical().Read(path)
	if err != nil {
		v.t.Fatalf("read %s: %v", path, err)
	}
	return s
}

// prefix is the test's KV prefix; putKV writes a KV v2 version of id under it.
func (v *devVault) prefix() string { return "egressd-test/" + v.name }

func (v *devVault) putKV(id string, data map[string]any) {
	v.t.Helper()
	v.write("secret/data/"+v.prefix()+"/"+id, map[string]any{"data": data})
}

// policy creates the test's policy: read under its KV prefix, plus extra rules.
func (v *devVault) policy(extra string) string {
	v.t.Helper()
	rules := fmt.Sprintf("path \"secret/data/%s/*\" { capabilities = [\"read\"] }\n%s", v.prefix(), extra)
	if err := v.root.Sys().PutPolicy(v.name, rules); err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() { v.root.Sys().DeletePolicy(v.name) })
	return v.name
}

// childToken creates a token with the test's policy and returns it in a file.
func (v *devVault) childToken(ttl string) string {
	v.t.Helper()
	s := v.write("auth/token/create", map[string]any{"policies": []string{v.policy("")}, "ttl": ttl, "renewable": true})
	return writeFile(v.t, "token", s.Auth.ClientToken+"\n")
}

// enableAuth mounts an auth method at the test's own path.
func (v *devVault) enableAuth(kind string) string {
	v.t.Helper()
	mount := kind + "-" + v.name
	if err := v.root.Sys().EnableAuthWithOptions(mount, &api.EnableAuthOptions{Type: kind}); err != nil {
		v.t.Fatalf("enable %s auth: %v", kind, err)
	}
	v.t.Cleanup(func() { v.root.Sys().DisableAuth(mount) })
	return mount
}

// appRole makes a role on mount with the test's policy and returns its role ID and secret
// ID files.
func (v *devVault) appRole(mount, extraPolicy string, ttl string) (roleIDFile, secretIDFile string) {
	v.t.Helper()
	role := "auth/" + mount + "/role/" + v.name
	v.write(role, map[string]any{"token_policies": []string{v.policy(extraPolicy)}, "token_ttl": ttl, "token_max_ttl": "1h"})
	roleID := v.read(role + "/role-id").Data["role_id"].(string)
	secretID := v.write(role+"/secret-id", nil).Data["secret_id"].(string)
	return writeFile(v.t, "role-id", roleID), writeFile(v.t, "secret-id", secretID)
}

// run is a Store over a Backend on the dev Vault (or on addr), with its log, counts
// and reads.
type run struct {
	b       *Backend
	s       *credential.Store
	log     *syncBuffer
	results sync.Map // "id result" -> *atomic.Int64
	mu      sync.Mutex
	reads   []read
}

// read is one of the Store's reads: when it began and ended, its result and the
// version Get served after it.
type read struct {
	id, result, version string
	began, ended        time.Time
}

// record notes a read of id that has just ended with result.
func (r *run) record(id, result string) {
	rd := read{id: id, result: result, ended: time.Now()}
	if v, err := r.s.Get(id); err == nil {
		rd.began, rd.version = v.ReadAt, v.Version
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = append(r.reads, rd)
}

// firstReadSince returns id's first good read begun after since, and the read that
// ended last before it; ok is false while there is none.
func (r *run) firstReadSince(id string, since time.Time) (first, prev read, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range r.reads {
		switch {
		case rd.id != id:
		case rd.result == credential.ResultOK && rd.began.After(since):
			return rd, prev, true
		default:
			prev = rd
		}
	}
	return read{}, prev, false
}

func (r *run) count(id, result string) int64 {
	if n, ok := r.results.Load(id + " " + result); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// start runs a Store over a Backend with o (Address: the dev Vault unless set, KVPrefix:
// the test's) for ids, refreshing every refresh.
func (v *devVault) start(o Options, so credential.Options, ids ...string) *run {
	v.t.Helper()
	r := &run{log: &syncBuffer{}}
	o.Address = or(o.Address, v.addr)
	o.KVPrefix = or(o.KVPrefix, v.prefix())
	o.Log = zerolog.New(r.log).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	if o.LoginBackoff == 0 {
		o.LoginBackoff = 200 * time.Millisecond
	}
	b, err := New(o)
	if err != nil {
		v.t.Fatal(err)
	}
	so.Log = o.Log
	so.Metrics = &credential.Metrics{Refresh: func(id, result string) {
		n, _ := r.results.LoadOrStore(id+" "+result, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		r.record(id, result)
	}}
	r.b, r.s = b, credential.NewStore(b, ids, so)
	ctx, cancel := context.WithCancel(context.Background())
	r.s.Start(ctx)
	v.t.Cleanup(func() {
		cancel()
		r.s.Wait()
		if strings.Contains(r.log.String(), planted) {
			v.t.Errorf("the log shows a secret:\n%s", r.log)
		}
		if v.t.Failed() {
			v.t.Logf("backend log:\n%s", r.log)
		}
	})
	return r
}

// header returns the value of the one header id injects now, or the error.
func (r *run) header(id string) (string, error) {
	v, err := r.s.Get(id)
	if err != nil {
		return "", err
	}
	return v.Headers[0].Value, nil
}

func TestVaultTokenAuthRead(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	v.putKV("basic", map[string]any{"username": "u", "password": planted})
	r := v.start(Options{Auth: NewTokenAuth("", v.childToken("1h"))}, credential.Options{}, "api", "basic")
	val, err := r.s.Get("api")
	if err != nil || val.Headers[0].Value != "Bearer "+planted || val.Version != "1" {
		t.Fatalf("api: %v %v", val, err)
	}
	if h, err := r.header("basic"); err != nil || !strings.HasPrefix(h, "Basic ") {
		t.Errorf("basic: %v", err)
	}
}

func TestVaultAppRoleLogin(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"headers": map[string]any{"X-Api-Key": planted}})
	roleID, secretID := v.appRole("approle", "", "1h")
	r := v.start(Options{Auth: NewAppRoleAuth("", roleID, secretID)}, credential.Options{}, "api")
	if h, err := r.header("api"); err != nil || h != planted {
		t.Fatalf("api: %v", err)
	}
	if !strings.Contains(r.log.String(), `"method":"approle"`) {
		t.Errorf("no approle login in the log:\n%s", r.log)
	}
}

func TestVaultJWTLogin(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	mount := v.enableAuth("jwt")
	v.write("auth/"+mount+"/config", map[string]any{
		"jwt_validation_pubkeys": []string{string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))},
	})
	v.write("auth/"+mount+"/role/"+v.name, map[string]any{
		"role_type": "jwt", "bound_audiences": []string{"vault.egressd.test"}, "user_claim": "sub",
		"token_policies": []string{v.policy("")}, "token_ttl": "1h",
	})
	now := time.Now()
	jwt := signES256(t, key, map[string]any{"sub": "system:serviceaccount:agents:egressd", "aud": "vault.egressd.test",
		"iat": now.Unix(), "nbf": now.Unix() - 5, "exp": now.Add(10 * time.Minute).Unix()})
	r := v.start(Options{Auth: NewJWTAuth(mount, v.name, writeFile(t, "jwt", jwt))}, credential.Options{}, "api")
	if h, err := r.header("api"); err != nil || h != "Bearer "+planted {
		t.Fatalf("api: %v", err)
	}

	// A JWT for another audience is refused; the error shows neither JWT.
	bad := signES256(t, key, map[string]any{"sub": "x", "aud": "elsewhere", "iat": now.Unix(), "exp": now.Add(time.Minute).Unix()})
	_, err = NewJWTAuth(mount, v.name, writeFile(t, "bad-jwt", bad)).Login(context.Background(), r.b.client)
	if err == nil || strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), jwt) {
		t.Errorf("wrong audience: %v", err)
	}
	t.Logf("wrong audience: %v", err)
}

// signES256 returns a compact JWS (ES256) over claims.
func signES256(t *testing.T, key *ecdsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(map[string]string{"alg": "ES256", "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signing))
	rr, ss, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	rr.FillBytes(sig[:32])
	ss.FillBytes(sig[32:])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestVaultTokenRenewal(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	tokenFile := v.childToken("3s")
	r := v.start(Options{Auth: NewTokenAuth("", tokenFile)},
		credential.Options{Refresh: 500 * time.Millisecond, MaxStale: time.Minute}, "api")
	start := time.Now()
	for time.Since(start) < 8*time.Second {
		if _, err := r.s.Get("api"); err != nil {
			t.Fatalf("after %v: %v", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := r.count("api", credential.ResultError); n > 0 {
		t.Errorf("%d failed reads across the token's renewals", n)
	}
	ok := r.count("api", credential.ResultOK)
	if ok < 12 {
		t.Errorf("only %d good reads in 8s at a 500ms refresh", ok)
	}
	// The token outlived its 3s TTL: Vault still knows it (an expired token is gone).
	tok, _ := os.ReadFile(tokenFile)
	look, err := v.root.Logical().Write("auth/token/lookup", map[string]any{"token": strings.TrimSpace(string(tok))})
	renewals := strings.Count(r.log.String(), "vault token renewed")
	t.Logf("8s on a 3s token: %d good reads, %d renewals, lookup error %v", ok, renewals, err)
	if renewals < 2 || err != nil || look == nil {
		t.Errorf("the token was not kept alive: %d renewals, lookup: %v", renewals, err)
	}
}

// appRoleVault is a dev Vault with the test's "api" secret and an AppRole on its own
// mount: the mount and the role ID and secret ID files.
func appRoleVault(t *testing.T) (v *devVault, mount, roleID, secretID string) {
	t.Helper()
	v = newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	mount = v.enableAuth("approle")
	roleID, secretID = v.appRole(mount, "", "1h")
	return v, mount, roleID, secretID
}

func TestVaultReloginAfterRevocation(t *testing.T) {
	t.Parallel()
	v, mount, roleID, secretID := appRoleVault(t)
	r := v.start(Options{Auth: NewAppRoleAuth(mount, roleID, secretID)},
		credential.Options{Refresh: 300 * time.Millisecond, MaxStale: time.Minute}, "api")
	if _, err := r.s.Get("api"); err != nil {
		t.Fatal(err)
	}
	v.write("sys/leases/revoke-prefix/auth/"+mount+"/login", nil)
	took := eventually(t, 10*time.Second, "a second login", func() bool {
		return strings.Count(r.log.String(), `"message":"vault login"`) >= 2
	})
	before := r.count("api", credential.ResultOK)
	eventually(t, 5*time.Second, "good reads after the new login", func() bool { return r.count("api", credential.ResultOK) > before+1 })
	t.Logf("logged in again %v after the revocation; failed reads: %d", took, r.count("api", credential.ResultError))
	if n := r.count("api", credential.ResultError); n > 0 {
		t.Errorf("%d failed reads: the read that met the revoked token should have logged in again and retried", n)
	}
	if _, err := r.s.Get("api"); err != nil {
		t.Errorf("after the revocation: %v", err)
	}
}

// A token that cannot be renewed past its max TTL, or not at all (a batch token), is
// replaced by a new login: reads never fail. The batch token is replaced before it
// expires (LifetimeWatcher's grace). At a max TTL of a few seconds Vault reports the
// remaining TTL in whole seconds, rounded up, so LifetimeWatcher sometimes renews a
// moment after the token expired; then the read that meets the expired token logs in
// again and retries. Either way no read fails; the log line says which happened.
func TestVaultReloginBeforeExpiry(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, tokenType, ttl, maxTTL string }{
		{"max-ttl", "service", "2s", "4s"},
		{"batch", "batch", "3s", "3s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v := newDevVault(t)
			v.putKV("api", map[string]any{"token": planted})
			mount := v.enableAuth("approle")
			role := "auth/" + mount + "/role/" + v.name
			v.write(role, map[string]any{"token_policies": []string{v.policy("")}, "token_type": c.tokenType,
				"token_ttl": c.ttl, "token_max_ttl": c.maxTTL})
			roleID := writeFile(t, "role-id", v.read(role + "/role-id").Data["role_id"].(string))
			secretID := writeFile(t, "secret-id", v.write(role+"/secret-id", nil).Data["secret_id"].(string))
			r := v.start(Options{Auth: NewAppRoleAuth(mount, roleID, secretID)},
				credential.Options{Refresh: 250 * time.Millisecond, MaxStale: time.Minute}, "api")
			time.Sleep(9 * time.Second)
			log := r.log.String()
			logins := strings.Count(log, `"message":"vault login"`)
			early := strings.Count(log, "logging in again before it expires")
			t.Logf("9s on %s tokens (ttl %s, max %s): %d logins (%d before expiry, %d after Vault rejected the token), %d good reads, %d failed",
				c.tokenType, c.ttl, c.maxTTL, logins, early, strings.Count(log, "vault rejected the token"),
				r.count("api", credential.ResultOK), r.count("api", credential.ResultError))
			if logins < 2 || c.tokenType == "batch" && early < 1 {
				t.Errorf("%d logins in 9s, %d of them before expiry", logins, early)
			}
			if n := r.count("api", credential.ResultError); n > 0 {
				t.Errorf("%d failed reads", n)
			}
		})
	}
}

func TestVaultRotation(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted + "-v1"})
	const refresh = time.Second
	r := v.start(Options{Auth: NewTokenAuth("", v.childToken("1h"))},
		credential.Options{Refresh: refresh, MaxStale: time.Minute}, "api")
	if h, err := r.header("api"); err != nil || h != "Bearer "+planted+"-v1" {
		t.Fatalf("v1: %v", err)
	}
	v.putKV("api", map[string]any{"token": planted + "-v2"})
	written := time.Now()
	// The first read begun after the write serves version 2 and begins within
	// refresh+jitter (+ slack for a timer's wake-up) of the write, or of the end of
	// the read before it: a read in flight at the write may still get version 1,
	// and how long Vault takes to answer, which load stretches, is not the
	// refresh schedule's to bound.
	var first, prev read
	eventually(t, 10*refresh, "a read begun after the write", func() (ok bool) {
		first, prev, ok = r.firstReadSince("api", written)
		return ok
	})
	if first.version != "2" {
		t.Errorf("the first read begun after the write served version %q, want 2", first.version)
	}
	from := written
	if prev.ended.After(from) {
		from = prev.ended
	}
	if limit := time.Duration(float64(refresh)*(1+credential.DefaultJitter)) + 500*time.Millisecond; first.began.Sub(from) > limit {
		t.Errorf("the read that took version 2 began %v after the write or the read before it, want within refresh+jitter+slack %v",
			first.began.Sub(from), limit)
	}
	if h, err := r.header("api"); err != nil || h != "Bearer "+planted+"-v2" {
		t.Errorf("after the read: %v, want version 2's header", err)
	}
	t.Logf("version 2 read %v after the write, served %v after it (refresh %v)",
		first.began.Sub(written).Round(time.Millisecond), first.ended.Sub(written).Round(time.Millisecond), refresh)
	if !strings.Contains(r.log.String(), `"previous_version":"1"`) {
		t.Errorf("no rotation line:\n%s", r.log)
	}
}

func TestVaultSecretDeleted(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	for _, id := range []string{"soft", "destroyed", "gone"} {
		v.putKV(id, map[string]any{"token": planted})
		v.putKV(id, map[string]any{"token": planted + "-2"})
	}
	r := v.start(Options{Auth: NewTokenAuth("", v.childToken("1h"))},
		credential.Options{Refresh: 300 * time.Millisecond, MaxStale: time.Hour}, "soft", "destroyed", "gone")
	for _, id := range []string{"soft", "destroyed", "gone"} {
		if _, err := r.s.Get(id); err != nil {
			t.Fatal(err)
		}
	}
	p := v.prefix()
	if _, err := v.root.Logical().Delete("secret/data/" + p + "/soft"); err != nil {
		t.Fatal(err)
	}
	v.write("secret/destroy/"+p+"/destroyed", map[string]any{"versions": []int{2}})
	if _, err := v.root.Logical().Delete("secret/metadata/" + p + "/gone"); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"soft": "deleted", "destroyed": "destroyed", "gone": "no secret"} {
		// Unavailable at the next read, although max_stale is an hour: Vault answered.
		took := eventually(t, 2*time.Second, id+" unavailable", func() bool { _, err := r.s.Get(id); return err != nil })
		_, err := r.s.Get(id)
		var ue *credential.UnavailableError
		if !errors.As(err, &ue) || ue.Cause != credential.CauseNotFound || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want not_found (%s)", id, err, want)
		}
		t.Logf("%s: unavailable %v after the deletion: %v", id, took, err)
	}
}

func TestVaultWrongShape(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.putKV("shape", map[string]any{"tokne": planted})
	v.putKV("crlf", map[string]any{"token": planted + "\r\nX-Injected: 1"})
	r := v.start(Options{Auth: NewTokenAuth("", v.childToken("1h"))}, credential.Options{}, "shape", "crlf")
	for _, id := range []string{"shape", "crlf"} {
		_, err := r.s.Get(id)
		var ue *credential.UnavailableError
		if !errors.As(err, &ue) || ue.Cause != credential.CauseInvalid || !strings.Contains(err.Error(), "credential "+id) ||
			strings.Contains(err.Error(), planted) {
			t.Errorf("%s: %v", id, err)
		}
		if st := r.s.Status()[id]; strings.Contains(st.Error, planted) {
			t.Errorf("%s: status shows the secret: %s", id, st.Error)
		}
		t.Logf("%s: %v", id, err)
	}
}

// forwarder is a TCP relay on 127.0.0.1 to Vault that the test stops and starts again
// on the same port: "Vault stopped" without stopping the shared dev server.
type forwarder struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newForwarder(t *testing.T, target string) *forwarder {
	f := &forwarder{t: t, target: target, conns: map[net.Conn]bool{}}
	f.start("127.0.0.1:0")
	t.Cleanup(f.stop)
	return f
}

func (f *forwarder) start(addr string) {
	f.t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.ln, f.addr = ln, ln.Addr().String()
	f.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.relay(c)
		}
	}()
}

func (f *forwarder) relay(c net.Conn) {
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	f.conns[c], f.conns[up] = true, true
	f.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
}

// stop closes the listener and every relayed connection: connections are refused.
func (f *forwarder) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln != nil {
		f.ln.Close()
		f.ln = nil
	}
	for c := range f.conns {
		c.Close()
	}
	clear(f.conns)
}

func TestVaultStoppedThenBack(t *testing.T) {
	v := newDevVault(t)
	v.putKV("api", map[string]any{"token": planted})
	u, _ := url.Parse(v.addr)
	fw := newForwarder(t, u.Host)
	t.Setenv("VAULT_MAX_RETRIES", "0") // each read fails at once rather than after 2 retries
	const maxStale, refresh = 3 * time.Second, 300 * time.Millisecond
	r := v.start(Options{Address: "http://" + fw.addr, Auth: NewTokenAuth("", v.childToken("1h"))},
		credential.Options{Refresh: refresh, MaxStale: maxStale}, "api")
	good, err := r.s.Get("api")
	if err != nil {
		t.Fatal(err)
	}
	fw.stop()
	stopped := time.Now()
	// Until max_stale after the last good read, the last good value is served.
	for time.Since(good.ReadAt) < maxStale-200*time.Millisecond {
		if h, err := r.header("api"); err != nil || h != "Bearer "+planted {
			t.Fatalf("%v into the outage (last good read %v before it): %v", time.Since(stopped), stopped.Sub(good.ReadAt), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Then it is unavailable: fail closed.
	eventually(t, maxStale, "stale", func() bool { _, err := r.s.Get("api"); return err != nil })
	_, err = r.s.Get("api")
	var ue *credential.UnavailableError
	if !errors.As(err, &ue) || ue.Cause != credential.CauseStale || strings.Contains(err.Error(), planted) {
		t.Fatalf("past max_stale: %v", err)
	}
	t.Logf("unavailable %v after the stop (max_stale %v): %v", time.Since(stopped).Round(time.Millisecond), maxStale, err)
	if r.count("api", credential.ResultError) == 0 {
		t.Error("no failed reads counted during the outage")
	}
	// Vault back on the same address: served again without a restart.
	fw.start(fw.addr)
	back := time.Now()
	eventually(t, 3*time.Second, "recovery", func() bool { _, err := r.s.Get("api"); return err == nil })
	t.Logf("served again %v after Vault came back", time.Since(back).Round(time.Millisecond))
}

func TestVaultIdentityToken(t *testing.T) {
	t.Parallel()
	v := newDevVault(t)
	v.write("identity/oidc/key/"+v.name, map[string]any{"allowed_client_ids": "*", "rotation_period": "24h", "verification_ttl": "24h"})
	v.write("identity/oidc/role/"+v.name, map[string]any{"key": v.name, "ttl": "3s"})
	t.Cleanup(func() {
		v.root.Logical().Delete("identity/oidc/role/" + v.name)
		v.root.Logical().Delete("identity/oidc/key/" + v.name)
	})
	// Identity tokens need an entity: log in with AppRole, which makes one.
	roleID, secretID := v.appRole("approle", fmt.Sprintf("path \"identity/oidc/token/%s\" { capabilities = [\"read\"] }", v.name), "1h")
	id := "oidc/" + v.name
	r := v.start(Options{Auth: NewAppRoleAuth("", roleID, secretID), Paths: map[string]Path{id: {Path: "identity/oidc/token/" + v.name}}},
		credential.Options{Refresh: time.Hour, MaxStale: time.Hour}, id)
	first, err := r.s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	jwt, ok := strings.CutPrefix(first.Headers[0].Value, "Bearer ")
	if !ok || strings.Count(jwt, ".") != 2 || !strings.HasPrefix(first.Version, "hmac:") {
		t.Fatalf("not a bearer JWT: version %s", first.Version)
	}
	// Read again at about 2/3 of the 3s TTL, by the backend alone (the Store's refresh is 1h).
	took := eventually(t, 4*time.Second, "a new identity token", func() bool {
		v, err := r.s.Get(id)
		return err == nil && v.Version != first.Version
	})
	t.Logf("new identity token %v after the first (ttl 3s)", took.Round(time.Millisecond))
	if took > 2800*time.Millisecond {
		t.Errorf("the new token came %v after the first: too close to the 3s expiry", took)
	}
}
