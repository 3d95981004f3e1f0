package oauth

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
)

// hammer asks for id's header 20 times a second for d, as a sandbox sending 20 requests a
// second to the entry's host does.
func (r *rig) hammer(id string, d time.Duration) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		r.m.Get(id)
	}
}

// failureLines counts the log lines of failed token calls.
func (r *rig) failureLines() int {
	return strings.Count(r.log.String(), "oauth2 token refresh failed")
}

// callsCounted checks that egressd_oauth_refresh_total counted the calls the endpoint saw,
// no more and no fewer.
func (r *rig) callsCounted(t *testing.T, e *endpoint, id string) {
	t.Helper()
	if ok, bad, n := r.count(id, ResultOK), r.count(id, ResultError), len(e.log()); ok+bad != int64(n) {
		t.Errorf("refresh_total counted %d ok + %d error, the endpoint saw %d calls", ok, bad, n)
	}
}

// TestFailingEndpointKeepsItsSchedule: a token endpoint answering 500, asked for a token by
// 20 requests a second for 3 s, sees the back-off's calls and no more. A call, then retries
// 0.5–1.5 s, 1–3 s and 2–6 s after each failure: at most 3 calls in 3 s, one log line each.
// Every call is one call in one client-authentication style, whether the style is still
// unknown (HTTP Basic first) or learnt (the form): a 500 says nothing about the style, so it
// is never retried in the other.
func TestFailingEndpointKeepsItsSchedule(t *testing.T) {
	for _, learnt := range []bool{false, true} {
		t.Run(fmt.Sprintf("style_learnt=%v", learnt), func(t *testing.T) {
			e := newEndpoint(t)
			e.basicNo = learnt // the first call learns the form
			e.down.Store(!learnt)
			r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
			before := 0 // the calls of the schedule: Start's, then the retries
			if learnt {
				before = len(e.log())
				e.down.Store(true)
				r.m.state("oa").cur.Store(nil) // expired: the next request may start a call
			}
			r.hammer("oa", 3*time.Second)
			r.settle(t, "oa")
			calls := e.log()[before:]
			if n := len(calls); n < 2 || n > 3 {
				t.Errorf("%d token calls in 3 s of 20 requests a second, want 2 or 3 (the back-off's): %+v", n, calls)
			}
			want := map[bool]string{false: "basic ", true: "form "}[learnt]
			for _, c := range calls {
				if !strings.HasPrefix(c.auth, want) {
					t.Errorf("a call authenticated by %q, want only %q: %+v", c.auth, want, calls)
				}
			}
			if lines := r.failureLines(); lines != len(calls) {
				t.Errorf("%d failure lines for %d failed calls, want one per back-off step", lines, len(calls))
			}
			r.callsCounted(t, e, "oa")
		})
	}
}

// TestParamsOnlyEndpointSeesBasicOnce: an endpoint that refuses HTTP Basic (invalid_client)
// and accepts the form sees one Basic call, ever: not after the operator changes the secret,
// nor when it refuses the client for a while (the form worked: the style is not to blame),
// nor on later refreshes.
func TestParamsOnlyEndpointSeesBasicOnce(t *testing.T) {
	e := newEndpoint(t)
	e.basicNo = true
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	// The operator stores a new refresh token: a new version, the same client.
	rotated := strings.ReplaceAll(strings.ReplaceAll(oauthSecret, refresh1, refresh2), "TOKEN_URL", e.srv.URL+"/token")
	if err := os.WriteFile(r.path, []byte(`{"oa": `+rotated+`}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Counted: the refused Basic call (error), the form's (ok), then the new version's (ok).
	eventually(t, "a call with the new refresh token", func() bool { return r.count("oa", ResultOK) == 2 })
	if c := e.log(); c[len(c)-1].refresh != refresh2 {
		t.Fatalf("the last call sent %q, want the new refresh token", c[len(c)-1].refresh)
	}
	st := r.m.state("oa")
	eventually(t, "the refresh done", func() bool { return !st.busy.Load() })
	e.refuse.Store(true)
	st.cur.Store(nil)
	r.m.Get("oa")
	eventually(t, "a refused call", func() bool { return r.count("oa", ResultError) == 2 })
	e.refuse.Store(false)
	eventually(t, "a token again", func() bool { _, err := r.header("oa"); return err == nil })
	basic, form := e.styles()
	if basic != 1 || form < 3 {
		t.Errorf("%d Basic and %d form calls, want 1 Basic ever: %+v", basic, form, e.log())
	}
	if n := strings.Count(r.log.String(), "oauth2 client authentication learnt"); n != 1 {
		t.Errorf("%d learnt lines, want 1:\n%s", n, r.log)
	}
	r.callsCounted(t, e, "oa")
}

// TestRefusedClientOneCallPerAttempt: when the endpoint refuses the client whatever the style
// (a wrong client secret), only the first attempt tries both styles; every later one, paced
// by the back-off while requests keep coming, is a single call.
func TestRefusedClientOneCallPerAttempt(t *testing.T) {
	const wrong = "cs-PLANTED-wrong-5e0b"
	e := newEndpoint(t)
	r := newRig(t, e, map[string]string{"oa": strings.ReplaceAll(oauthSecret, clientSecret, wrong)}, false)
	r.hammer("oa", 3*time.Second)
	r.settle(t, "oa")
	calls, attempts := len(e.log()), r.failureLines()
	if attempts < 2 || attempts > 3 || calls != attempts+1 {
		t.Errorf("%d calls in %d attempts, want 2 or 3 attempts and one call each but the first's two: %+v", calls, attempts, e.log())
	}
	if strings.Contains(r.log.String(), wrong) {
		t.Error("the log shows the client secret")
	}
	r.callsCounted(t, e, "oa")
}

// TestNoClientNoCallCounted: an attempt without an HTTP client fails (logged, backed off)
// but is no token call: egressd_oauth_refresh_total counts calls only.
func TestNoClientNoCallCounted(t *testing.T) {
	e := newEndpoint(t)
	r := newRig(t, e, map[string]string{"oa": oauthSecret}, false)
	r.m.client.Store(nil)
	r.m.state("oa").cur.Store(nil)
	r.m.Get("oa")
	eventually(t, "a failed attempt", func() bool { return r.failureLines() == 1 })
	if n := r.count("oa", ResultError); n != 0 {
		t.Errorf("%d errors counted without a call", n)
	}
	r.callsCounted(t, e, "oa")
}

// scans counts the Manager's looks at its Source (IDs), which tells of its changes.
type scans struct {
	*credential.Store
	n atomic.Int64
}

func (s *scans) IDs() []string { s.n.Add(1); return s.Store.IDs() }

// TestStaticScopeWaitsForAChange: with no oauth2 or github_app credential the Manager
// stops looking every Tick, and a secret that becomes oauth2 wakes it: its first
// token is fetched without a request asking for it.
func TestStaticScopeWaitsForAChange(t *testing.T) {
	e := newEndpoint(t)
	r := newRig(t, e, map[string]string{"st": `{"token": "static"}`}, false)
	src := &scans{Store: r.store}
	m := New(src, Options{Log: zerolog.New(r.log), Tick: time.Millisecond})
	m.SetClient(testClient(t, e))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); m.Wait() })
	m.Start(ctx)
	eventually(t, "the first look", func() bool { return src.n.Load() >= 2 })
	before := src.n.Load()
	time.Sleep(100 * time.Millisecond) // a hundred Ticks
	if n := src.n.Load() - before; n > 1 {
		t.Fatalf("%d looks in 100 Ticks with nothing minted", n)
	}
	writeCreds(t, r.path, `{"st": `+strings.ReplaceAll(oauthSecret, "TOKEN_URL", e.srv.URL+"/token")+`}`)
	eventually(t, "the token of a secret become oauth2", func() bool { return m.state("st").cur.Load() != nil })
}

func writeCreds(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
