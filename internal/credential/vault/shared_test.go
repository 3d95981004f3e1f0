package vault

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/credential"
)

// sharedVault is a dev Vault with an AppRole whose login tokens Vault counts the
// uses of (token_num_uses) and whose secret ID it counts the logins of
// (num_uses): the figures below are Vault's own, not egressd's.
type sharedVault struct {
	*devVault
	mount, role, secretID string
	accessors             []any // the role's login tokens, once found (requests)
}

// Generous counts: only what is used of them matters.
const (
	tokenUses = 1_000_000
	loginUses = 1000
)

func newSharedVault(t *testing.T) *sharedVault {
	v := &sharedVault{devVault: newDevVault(t)}
	v.mount = v.enableAuth("approle")
	v.role = "auth/" + v.mount + "/role/" + v.name
	v.write(v.role, map[string]any{"token_policies": []string{v.policy("")}, "token_ttl": "1h", "token_num_uses": tokenUses})
	v.secretID = v.write(v.role+"/secret-id", map[string]any{"num_uses": loginUses}).Data["secret_id"].(string)
	return v
}

// session is a Session logging in with the AppRole, cached for cacheFor, running
// until the test ends.
func (v *sharedVault) session(cacheFor time.Duration) *Session {
	v.t.Helper()
	roleID := v.read(v.role + "/role-id").Data["role_id"].(string)
	s, err := NewSession(Options{Address: v.addr, Auth: NewAppRoleAuth(v.mount, writeFile(v.t, "role-id", roleID),
		writeFile(v.t, "secret-id", v.secretID))}, cacheFor)
	if err != nil {
		v.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	v.t.Cleanup(func() { cancel(); wg.Wait() })
	return s
}

// logins is how many times the secret ID has logged in, by Vault's count.
func (v *sharedVault) logins() int64 {
	v.t.Helper()
	sec := v.write(v.role+"/secret-id/lookup", map[string]any{"secret_id": v.secretID})
	left, _ := toInt(sec.Data["secret_id_num_uses"])
	return loginUses - left
}

// requests is how many requests the role's login tokens have made, by Vault's
// count of each token's uses. The tokens are found among every token of the
// dev Vault once, so that later counts are one quick look each.
func (v *sharedVault) requests() int64 {
	v.t.Helper()
	if len(v.accessors) == 0 {
		list, err := v.root.Logical().List("auth/token/accessors")
		if err != nil {
			v.t.Fatal(err)
		}
		for _, a := range list.Data["keys"].([]any) {
			sec, err := v.root.Logical().Write("auth/token/lookup-accessor", map[string]any{"accessor": a})
			if err != nil || sec == nil {
				continue // expired or revoked meanwhile: not the test's
			}
			if meta, _ := sec.Data["meta"].(map[string]any); meta["role_name"] == v.name {
				v.accessors = append(v.accessors, a)
			}
		}
	}
	var n int64
	for _, a := range v.accessors {
		sec, err := v.root.Logical().Write("auth/token/lookup-accessor", map[string]any{"accessor": a})
		if err != nil || sec == nil {
			v.t.Fatalf("the test's token %v: %v", a, err)
		}
		left, _ := toInt(sec.Data["num_uses"])
		n += tokenUses - left
	}
	return n
}

// rate is the reads per refresh interval Vault served over a few intervals, by
// its own count.
func (v *sharedVault) rate(refresh time.Duration) float64 {
	v.t.Helper()
	before := v.requests()
	start := time.Now()
	time.Sleep(3 * refresh)
	return float64(v.requests()-before) / (float64(time.Since(start)) / float64(refresh))
}

// firstReads runs stores (as v.stores) and checks that their first reads cost
// Vault about one read of each of paths per cacheFor they took (and the one
// renewal of the session's token).
func (v *sharedVault) firstReads(paths int, cacheFor time.Duration, stores func()) {
	v.t.Helper()
	before := v.requests()
	start := time.Now()
	stores()
	took, n := time.Since(start), v.requests()-before
	v.t.Logf("first reads: %d in %v", n, took.Round(time.Millisecond))
	// +1: the token's first renewal, which Vault's LifetimeWatcher makes as it starts.
	if most := int64(paths)*(int64(took/cacheFor)+1) + 1; n < int64(paths) || n > most {
		v.t.Errorf("Vault served %d reads for the first reads of %d paths in %v, want %d to %d: one per path per %v",
			n, paths, took, paths, most, cacheFor)
	}
}

// stores runs one Store per scope over a Backend of s, each managing ids.
func (v *sharedVault) stores(s *Session, prefixes []string, refresh time.Duration, ids ...string) []*credential.Store {
	v.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make([]*credential.Store, len(prefixes))
	for i, p := range prefixes {
		b, err := s.Backend(Options{KVPrefix: p})
		if err != nil {
			v.t.Fatal(err)
		}
		out[i] = credential.NewStore(b, ids, credential.Options{Refresh: refresh})
		out[i].StartAsync(ctx)
	}
	v.t.Cleanup(func() {
		cancel()
		for _, st := range out {
			st.Wait()
		}
	})
	for _, st := range out {
		<-st.FirstRead()
	}
	return out
}

func header(t *testing.T, s *credential.Store, id string) string {
	t.Helper()
	val, err := s.Get(id)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return val.Headers[0].Value
}

// TestSessionSharesReads: 50 sandboxes naming the same 10 KV paths, and 10
// naming one path each under a prefix of their own, log in once and read each of
// the 20 paths once a refresh interval, counted by Vault; each sandbox gets its
// own scope's secret, and a rotation reaches every sandbox that names the path.
func TestSessionSharesReads(t *testing.T) {
	t.Parallel()
	v := newSharedVault(t)
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("k%d", i)
		v.putKV(ids[i], map[string]any{"token": "shared-" + ids[i]})
	}
	var shared, own []string
	for range 50 {
		shared = append(shared, v.prefix())
	}
	for i := range 10 {
		p := fmt.Sprintf("%s/own-%d", v.prefix(), i)
		own = append(own, p)
		v.write("secret/data/"+p+"/k0", map[string]any{"data": map[string]any{"token": fmt.Sprintf("own-%d", i)}})
	}
	const refresh, cacheFor = 2 * time.Second, 2 * time.Second * 9 / 10
	s := v.session(cacheFor)
	var sharedStores, ownStores []*credential.Store
	v.firstReads(20, cacheFor, func() {
		sharedStores = v.stores(s, shared, refresh, ids...)
		ownStores = v.stores(s, own, refresh, "k0")
	})
	for i, st := range ownStores {
		if got := header(t, st, "k0"); got != fmt.Sprintf("Bearer own-%d", i) {
			t.Errorf("sandbox own-%d got %q: another scope's secret", i, got)
		}
	}
	for _, st := range sharedStores {
		if got := header(t, st, "k3"); got != "Bearer shared-k3" {
			t.Fatalf("a shared sandbox got %q", got)
		}
	}
	per := v.rate(refresh)
	t.Logf("reads per refresh interval: %.1f for 20 paths named by 60 sandboxes (%d unshared)", per, 50*len(ids)+10)
	// At most one read of each path a refresh; fewer when a loaded Vault is slow
	// to answer (a store does not read again while its read is in flight).
	if per > 20*1.5 || per == 0 {
		t.Errorf("%.1f reads per refresh interval, want about 20: one per path", per)
	}
	if n := v.logins(); n != 1 {
		t.Errorf("%d logins, want 1", n)
	}
	v.putKV("k3", map[string]any{"token": "rotated"})
	deadline := time.Now().Add(3 * refresh)
	for _, st := range sharedStores {
		for header(t, st, "k3") != "Bearer rotated" {
			if time.Now().After(deadline) {
				t.Fatalf("a sandbox still has the old k3 after %v", 3*refresh)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestSessionThousandSandboxes: 1,000 sandboxes naming the same 10 paths cause
// 10 reads per refresh interval, by Vault's count, and one login.
func TestSessionThousandSandboxes(t *testing.T) {
	t.Parallel()
	v := newSharedVault(t)
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("k%d", i)
		v.putKV(ids[i], map[string]any{"token": "v"})
	}
	prefixes := make([]string, 1000)
	for i := range prefixes {
		prefixes[i] = v.prefix()
	}
	const refresh, cacheFor = 2 * time.Second, 2 * time.Second * 9 / 10
	s := v.session(cacheFor)
	v.firstReads(len(ids), cacheFor, func() { v.stores(s, prefixes, refresh, ids...) })
	per := v.rate(refresh)
	t.Logf("1,000 sandboxes x 10 paths: %.1f reads per refresh interval (10,000 unshared), %d logins", per, v.logins())
	if per > 15 || per == 0 || v.logins() != 1 {
		t.Errorf("%.1f reads per refresh, %d logins; want about 10, 1", per, v.logins())
	}
}

// TestSessionCachesOnlyAnswers: a failed read is never served again from the
// cache (the next reader reads anew), while Vault's answer is, to every Backend
// naming the same path; a Backend naming another path reads its own.
func TestSessionCachesOnlyAnswers(t *testing.T) {
	f := newFakeVault(t)
	f.staticToken()
	var fail atomic.Bool
	fail.Store(true)
	f.handle("GET /v1/secret/data/p/x", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if fail.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"errors":["down"]}`)
			return
		}
		io.WriteString(w, `{"data": {"data": {"token": "px"}, "metadata": {"version": 1}}}`)
	})
	f.kv("q/x", 1, map[string]any{"token": "qx"})
	s, err := NewSession(Options{Address: f.srv.URL, Auth: NewTokenAuth("t", "")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	backend := func(prefix string) *Backend {
		b, err := s.Backend(Options{KVPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	p1, p2, q := backend("p"), backend("p"), backend("q")
	ctx := context.Background()
	if _, _, err := p1.Read(ctx, "x"); err == nil {
		t.Fatal("the failed read succeeded")
	}
	fail.Store(false)
	for i, b := range []*Backend{p2, p1} {
		if sec, _, err := b.Read(ctx, "x"); err != nil || sec.Headers[0].Value != "Bearer px" {
			t.Fatalf("read %d of p/x: %v %v", i, sec.Headers, err)
		}
	}
	if sec, _, err := q.Read(ctx, "x"); err != nil || sec.Headers[0].Value != "Bearer qx" {
		t.Fatalf("q/x: %v %v", sec.Headers, err)
	}
	if n := len(f.requestsTo("/p/x")); n != 2 {
		t.Errorf("Vault saw %d reads of p/x, want 2: the failed one and one for both Backends", n)
	}
}
