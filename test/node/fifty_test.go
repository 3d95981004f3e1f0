package node_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/netns"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// fifty is how many sandboxes TestNodeFiftySandboxes registers.
const fifty = 50

// scripted is how many of them deploy/netns/egressd-netns makes and registers
// (up --node, through the sandboxes directory); the rest are made by addSandbox
// and registered through the API, which is quicker.
const scripted = 2

// One node egressd, fifty sandboxes, each in its own network namespace with its
// own REDIRECT rules, each with its credentials in a real Vault under
// egressd/sandboxes/{sandbox}: the node's kv_prefix, expanded per sandbox.
func TestNodeFiftySandboxes(t *testing.T) {
	start := time.Now()
	v := startVault(t)
	ids := make([]string, fifty)
	hosts := []string{"shared.test", "plain.test", "hooks.test"}
	for i := range ids {
		ids[i] = fmt.Sprintf("s%02d", i)
		hosts = append(hosts, ids[i]+".test")
	}
	creds := fmt.Sprintf(`{backend: vault, vault: {address: %q, auth: {method: token, token_file: vault-token}, kv_mount: secret, kv_prefix: "egressd/sandboxes/{sandbox}", refresh: 1m}}`, v.addr)
	w := newWorldWith(t, creds, hosts, map[string]string{"vault-token": v.scopedToken(t, "egressd/sandboxes/*")})
	for _, id := range ids {
		w.secrets[id] = v.putSandboxSecrets(t, id)
	}
	w.makeFifty(t, ids)
	t.Logf("fifty sandboxes up and registered in %s", time.Since(start).Round(time.Millisecond))

	t.Run("each its own policy and Vault credential", func(t *testing.T) { w.fiftyOwn(t, ids) })
	t.Run("A reaches nothing of B's, nor the API or the admin listener", func(t *testing.T) { w.fiftyIsolation(t, ids[0], ids[1]) })
	t.Run("a flood from one leaves the others' hook calls answered", func(t *testing.T) { w.fiftyFlood(t, ids[2], ids[3:8]) })
	t.Run("removing a sandbox closes its tunnels within 1s", func(t *testing.T) { w.fiftyRemoval(t, ids[8], ids[9]) })
	t.Run("a policy change re-decides open tunnels", func(t *testing.T) { w.fiftyPolicyChange(t, ids[10], ids[11]) })
	t.Run("egressd-netns down --node deregisters", func(t *testing.T) { w.fiftyScriptDown(t, ids[1], ids[12]) })
	t.Logf("the whole test: %s", time.Since(start).Round(time.Millisecond))
}

// fiftySpec is sandbox id's spec: its own host and shared.test with its Vault
// credential "key", plain.test spliced (no credential), hooks.test for its
// runtime's hook calls through its hooks listener, and TOKEN's placeholder.
func fiftySpec(id string, plain, hooks bool) string {
	allow := fmt.Sprintf(`{"domain": %q, "credential": "key"}, {"domain": "shared.test", "credential": "key"}, {"domain": "hooks.test"}`, id+".test")
	if plain {
		allow += `, {"domain": "plain.test"}`
	}
	sources := ""
	if hooks {
		sources = `, "sources": [{"path": ".agents/hooks.json", "content": {"gate": {"pre_tool_execution": [
     {"matcher": "*", "hooks": [{"type": "http", "url": "https://hooks.test/hook", "timeout": 10}]}]}}}]`
	}
	return fmt.Sprintf(`{"environment": {"network": {"allowlist": [%s]}, "env": {"TOKEN": {"credential": "ph"}}%s},
 "limits": {"max_connections": 8}}`, allow, sources)
}

// withListeners adds the spec's netns and listeners, as egressd-netns does for
// the scripted sandboxes.
func withListeners(id, spec string) string {
	return fmt.Sprintf(`{"netns": "/run/netns/%s",
 "listeners": [{"name": "transparent", "address": "127.0.0.1:%s", "mode": "transparent"},
               {"name": "hooks", "address": "127.0.0.1:15003", "mode": "proxy", "role": "hooks", "peer_uids": [0]}], `, id, transparentPort) + strings.TrimPrefix(spec, "{")
}

// makeFifty makes the namespaces and registers the sandboxes, four at a time.
func (w *world) makeFifty(t *testing.T, ids []string) {
	t.Helper()
	err := forEach(ids, 4, func(i int, id string) error {
		if i < scripted {
			return w.scriptUp(t, id, i)
		}
		if err := makeSandbox(id); err != nil {
			return err
		}
		if code, body := w.put(t, id, withListeners(id, fiftySpec(id, true, true))); code != http.StatusCreated {
			return fmt.Errorf("PUT %s: %d %s", id, code, body)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, id := range ids[scripted:] {
			exec.Command("ip", "netns", "del", id).Run()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// forEach runs fn for each of ids, limit at a time, and joins their errors.
func forEach(ids []string, limit int, fn func(i int, id string) error) error {
	sem := make(chan struct{}, limit)
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = fn(i, id)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// scriptEnv is egressd-netns's environment for this node.
func (w *world) scriptEnv(id string, index int) []string {
	spec := filepath.Join(w.dir, id+"-part.json")
	return append(os.Environ(), "EGRESSD_NETNS_INDEX="+fmt.Sprint(index+1), "EGRESSD_TPROXY_PORT="+transparentPort,
		"EGRESSD_DNS_PORT=15053", "EGRESSD_NODE_SPEC="+spec, "EGRESSD_NODE_SANDBOXES_DIR="+filepath.Join(w.dir, "sandboxes.d"),
		"EGRESSD_NODE_CONFIG="+w.e.ConfigPath, "EGRESSD_BIN="+egressdtest.Binary(), "EGRESSD_NODE_WAIT=30")
}

const netnsScript = "../../deploy/netns/egressd-netns"

// scriptUp is `egressd-netns up ID --node`, with the sandbox's part of the spec
// (the script makes the transparent listener only: no hooks listener, so no
// pre-tool hooks).
func (w *world) scriptUp(t *testing.T, id string, index int) error {
	part := fiftySpec(id, true, false)
	if err := os.WriteFile(filepath.Join(w.dir, id+"-part.json"), []byte(part), 0o600); err != nil {
		return err
	}
	t.Cleanup(func() {
		c := exec.Command(netnsScript, "down", id, "--node")
		c.Env = w.scriptEnv(id, index)
		c.Run()
	})
	c := exec.Command(netnsScript, "up", id, "--node")
	c.Env = w.scriptEnv(id, index)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("egressd-netns up %s --node: %v\n%s", id, err, out)
	}
	return nil
}

// makeSandbox is addSandbox's namespace, returning its error.
func makeSandbox(name string) error {
	for _, c := range sandboxCommands(name) {
		if err := runSandboxCommand(c); err != nil {
			return err
		}
	}
	return nil
}

// fiftyOwn: every sandbox's curl to shared.test carries its own Vault secret,
// and another sandbox's host is refused to it.
func (w *world) fiftyOwn(t *testing.T, ids []string) {
	err := forEach(ids, 8, func(i int, id string) error {
		if status, reason := w.curlPath(t, id, "shared.test", "/own", "-H", "X-From: "+id); status != "200" {
			return fmt.Errorf("%s -> shared.test: %s %q, want 200", id, status, reason)
		}
		other := ids[(i+1)%len(ids)] + ".test"
		if status, reason := w.curlPath(t, id, other, "/other", "-H", "X-From: "+id); status != "403" || reason != "not_allowlisted" {
			return fmt.Errorf("%s -> %s: %s %q, want 403 not_allowlisted", id, other, status, reason)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, h := range w.up.hitsFor("/own") {
		seen[h.from]++
		if want := "Bearer " + w.secrets[h.from]; h.auth != want {
			t.Errorf("shared.test saw %s's request with another credential (%d bytes, want %s's)", h.from, len(h.auth), h.from)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("shared.test saw %d requests from %s, want 1", seen[id], id)
		}
	}
	if hits := w.up.hitsFor("/other"); len(hits) != 0 {
		t.Errorf("another sandbox's host saw %d requests", len(hits))
	}
	lines := map[string]int{}
	for _, l := range w.e.EgressLines() {
		if l.Str("host") != "shared.test" || l.Str("decision") != "allow" {
			continue
		}
		lines[l.Str("sandbox")]++
	}
	for _, id := range ids {
		if lines[id] == 0 {
			t.Errorf("no allowed egress line for shared.test with sandbox %s", id)
		}
	}
}

// fiftyIsolation: from sandbox a, b's host is refused and decided as a's (its
// line names a); the admin listener's port is refused, for it exists only in
// egressd's own namespace; the API socket is refused to the sandbox's user
// (its modes); and b's placeholder reaches the upstream as the worthless
// string it is, while a's own is replaced by a's value.
func (w *world) fiftyIsolation(t *testing.T, a, b string) {
	if status, reason := w.curlPath(t, a, b+".test", "/iso", "-H", "X-From: "+a); status != "403" || reason != "not_allowlisted" {
		t.Errorf("%s -> %s.test: %s %q, want 403 not_allowlisted", a, b, status, reason)
	}
	line := w.e.WaitLineT(t, a+"'s line for "+b+".test", func(l egressdtest.Line) bool {
		return l.Message() == "egress" && l.Str("host") == b+".test" && l.Str("reason") == "not_allowlisted"
	})
	if line.Str("sandbox") != a {
		t.Errorf("%s's request for %s.test decided as %q's", a, b, line.Str("sandbox"))
	}
	_, adminPort, _ := net.SplitHostPort(w.e.Admin)
	if err := dialIn(a, "127.0.0.1:"+adminPort); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s dialling the admin listener's port: %v, want connection refused", a, err)
	}
	// This package's user namespace maps one uid, so no other user can try the
	// socket here: its modes are the mechanism.
	w.checkAPIModes(t)
	ph := map[string]string{}
	for _, id := range []string{a, b} {
		_, info := w.get(t, id)
		ph[id], _ = info["env"].(map[string]any)["TOKEN"].(string)
	}
	if ph[a] == "" || ph[a] == ph[b] {
		t.Fatalf("placeholders %v: want one per sandbox", ph)
	}
	for _, p := range []string{ph[a], ph[b]} {
		if status, reason := w.curlPath(t, a, "shared.test", "/ph", "-H", "X-Token: "+p, "-H", "X-From: "+a); status != "200" {
			t.Errorf("%s -> shared.test with a placeholder: %s %s", a, status, reason)
		}
	}
	var got []string
	for _, h := range w.up.hitsFor("/ph") {
		got = append(got, h.token)
	}
	if want := []string{w.secrets[a] + "-ph", ph[b]}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("shared.test saw X-Token %q, want %s's value, then %s's placeholder unreplaced", got, a, b)
	}
}

// fiftyFlood: sandbox f sends hook calls through its hooks listener as fast as 48
// clients can, each held a second by the endpoint, for 3 s (at most 2,000
// calls); meanwhile each witness makes three hook calls through its own, which
// must all be answered allow well inside their 10 s timeout.
func (w *world) fiftyFlood(t *testing.T, f string, witnesses []string) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var sent, allowed atomic.Int64
	var flood sync.WaitGroup
	for range 48 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			c := w.hookClient(f)
			for ctx.Err() == nil && sent.Add(1) <= 2000 {
				if w.hookCall(ctx, c, "/hook/slow") == nil {
					allowed.Add(1)
				}
			}
		}()
	}
	var slowest atomic.Int64
	err := forEach(witnesses, len(witnesses), func(_ int, id string) error {
		c := w.hookClient(id)
		for range 3 {
			start := time.Now()
			cctx, ccancel := context.WithTimeout(t.Context(), 5*time.Second)
			err := w.hookCall(cctx, c, "/hook")
			ccancel()
			if err != nil {
				return fmt.Errorf("%s's hook call during %s's flood: %v", id, f, err)
			}
			if d := int64(time.Since(start)); d > slowest.Load() {
				slowest.Store(d)
			}
		}
		return nil
	})
	flood.Wait()
	t.Logf("flood from %s: %d calls sent, %d allowed; the witnesses' slowest call %s", f, min(sent.Load(), 2000), allowed.Load(), time.Duration(slowest.Load()))
	if err != nil {
		t.Error(err)
	}
}

// hookClient is an HTTP client in sandbox id, through its hooks listener.
func (w *world) hookClient(id string) *http.Client {
	pool := x509.NewCertPool()
	if b, err := os.ReadFile(w.bundle); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: "127.0.0.1:15003"}),
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = netns.Do("/run/netns/"+id, func() error {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// hookCall makes one pre-tool hook call to https://hooks.test+path and wants it
// answered allow.
func (w *world) hookCall(ctx context.Context, c *http.Client, path string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://hooks.test"+path, strings.NewReader(`{"tool_name": "bash"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"allow"`) {
		return fmt.Errorf("%d %s %q", resp.StatusCode, resp.Header.Get("Egressd-Reason"), body)
	}
	return nil
}

// fiftyRemoval: DELETE closes the removed sandbox's open tunnel within 1 s, and
// another's stays open.
func (w *world) fiftyRemoval(t *testing.T, gone, stays string) {
	tg, ts := w.hold(t, gone, "plain.test"), w.hold(t, stays, "plain.test")
	start := time.Now()
	if code := w.del(t, gone); code != http.StatusNoContent {
		t.Fatalf("DELETE %s: %d", gone, code)
	}
	if !tg.closedWithin(time.Second - time.Since(start)) {
		t.Fatalf("%s's tunnel still open 1s after DELETE", gone)
	}
	t.Logf("%s's tunnel closed %s after DELETE was sent", gone, time.Since(start).Round(time.Millisecond))
	if ts.closedWithin(300 * time.Millisecond) {
		t.Errorf("%s's tunnel closed when %s was removed", stays, gone)
	}
}

// fiftyPolicyChange: a PUT dropping plain.test closes the sandbox's open tunnel
// to it (logged policy_reload, naming the sandbox); another's stays open.
func (w *world) fiftyPolicyChange(t *testing.T, changed, stays string) {
	tc, ts := w.hold(t, changed, "plain.test"), w.hold(t, stays, "plain.test")
	if code, body := w.put(t, changed, withListeners(changed, fiftySpec(changed, false, true))); code != http.StatusOK {
		t.Fatalf("PUT %s: %d %s", changed, code, body)
	}
	if !tc.closedWithin(time.Second) {
		t.Fatalf("%s's tunnel to plain.test still open 1s after its policy dropped plain.test", changed)
	}
	line := w.e.WaitLineT(t, changed+"'s policy_reload line", func(l egressdtest.Line) bool {
		return l.Message() == "egress" && l.Str("detail") == "policy_reload"
	})
	if line.Str("sandbox") != changed || line.Str("host") != "plain.test" {
		t.Errorf("policy_reload line: %v", line)
	}
	if ts.closedWithin(300 * time.Millisecond) {
		t.Errorf("%s's tunnel closed when %s's policy changed", stays, changed)
	}
}

// fiftyScriptDown: `egressd-netns down --node` on a scripted sandbox removes its
// spec file; egressd then closes its tunnel, and the script waits for that.
func (w *world) fiftyScriptDown(t *testing.T, id, stays string) {
	td, ts := w.hold(t, id, "plain.test"), w.hold(t, stays, "plain.test")
	c := exec.Command(netnsScript, "down", id, "--node")
	c.Env = w.scriptEnv(id, 1)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("egressd-netns down %s --node: %v\n%s", id, err, out)
	}
	if !td.closedWithin(time.Second) {
		t.Errorf("%s's tunnel still open after egressd-netns down", id)
	}
	if code, _ := w.get(t, id); code != http.StatusNotFound {
		t.Errorf("GET %s after down: %d, want 404", id, code)
	}
	if ts.closedWithin(300 * time.Millisecond) {
		t.Errorf("%s's tunnel closed when %s went down", stays, id)
	}
}

// hitsFor lists the requests the upstream served for path.
func (u *upstream) hitsFor(path string) []hit {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []hit
	for _, h := range u.hits {
		if h.path == path {
			out = append(out, h)
		}
	}
	return out
}

// randomToken is a secret no other run shares.
func randomToken(t *testing.T) string {
	b := make([]byte, 12)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
