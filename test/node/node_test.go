package node_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/netns"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/pkg/hookauth"
)

// One node egressd, three sandboxes, each in its own network namespace with its own
// REDIRECT rules: A and C registered through the API, B through the sandboxes
// directory. A and B name their own credentials file, C resolves in the node's; all
// three name the same credential ID "key".
func TestNodeSandboxes(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"sbx-a", "sbx-b", "sbx-c"} {
		addSandbox(t, n)
	}
	if code, body := w.put(t, "sbx-a", specA); code != http.StatusCreated {
		t.Fatalf("PUT sbx-a: %d %s", code, body)
	}
	bFile := filepath.Join(w.dir, "sandboxes.d", "sbx-b.json")
	writeSpec(t, bFile, spec("sbx-b", filepath.Join(w.dir, "b-creds.json"), "b.test+key", "c.test"))
	if code, body := w.put(t, "sbx-c", spec("sbx-c", "", "a.test+key", "c.test")); code != http.StatusCreated {
		t.Fatalf("PUT sbx-c: %d %s", code, body)
	}
	w.waitRegistered(t, "sbx-b", 5*time.Second)

	t.Run("each sandbox its own policy and credential", w.ownPolicyAndCredential)
	t.Run("a sandbox reaches no other listener, nor the admin listener or the API", w.isolation)
	t.Run("hook assertions carry the sandbox", w.hookClaim)
	t.Run("a sandbox's placeholder is worthless in another", w.placeholders)
	t.Run("the DNS guard inside the sandbox", w.dnsGuard)
	t.Run("a bad spec changes nothing", w.badSpec)
	t.Run("a changed spec file re-decides open tunnels", func(t *testing.T) { w.changedFile(t, bFile) })
	t.Run("removing a sandbox closes its tunnels within 1s", w.removal)
	t.Run("SIGTERM drains a sandbox's request in flight", w.drain)
}

// SIGTERM lets a request in flight in a sandbox finish (limits.drain), as a
// sidecar's, and egressd then exits 0. It stops egressd: the last case.
func (w *world) drain(t *testing.T) {
	done := make(chan string, 1)
	go func() {
		status, _ := w.curlPath(t, "sbx-a", "a.test", "/slow")
		done <- status
	}()
	for deadline := time.Now().Add(5 * time.Second); !w.up.seen("/slow"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the upstream")
		}
	}
	if code, err := w.e.Stop(); code != 0 || err != nil {
		t.Errorf("SIGTERM: exit %d %v", code, err)
	}
	if status := <-done; status != "200" {
		t.Errorf("the request in flight at SIGTERM: %s, want 200", status)
	}
}

// specA is sbx-a's spec: its transparent listener, a hooks listener for its agent
// runtime, a DNS guard, its policy with an inline hooks.json, its own credentials.
var specA = `{"netns": "/run/netns/sbx-a",
 "listeners": [{"name": "transparent", "address": "127.0.0.1:` + transparentPort + `", "mode": "transparent"},
               {"name": "hooks", "address": "127.0.0.1:15003", "mode": "proxy", "role": "hooks", "peer_uids": [0]}],
 "dns": {"listen": "127.0.0.1:15053"},
 "environment": {"network": {"allowlist": [{"domain": "a.test", "credential": "key"}, {"domain": "c.test"}]},
   "env": {"TOKEN": {"credential": "ph"}},
   "sources": [{"path": ".agents/hooks.json", "content": {"gate": {"pre_tool_execution": [
     {"matcher": "*", "hooks": [{"type": "http", "url": "https://a.test/hook", "timeout": 10}]}]}}}]},
 "credentials": {"file": "a-creds.json"}}`

func writeSpec(t *testing.T, path, spec string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitRegistered waits until GET /v1/sandboxes/id answers 200.
func (w *world) waitRegistered(t *testing.T, id string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if code, _ := w.get(t, id); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not registered after %s", id, within)
		}
	}
}

// Each sandbox reaches what its own policy allows, with its own credential (the
// upstream's record shows which), and nothing else; each egress line names the
// sandbox it came from.
func (w *world) ownPolicyAndCredential(t *testing.T) {
	cases := []struct{ sandbox, host, status, reason string }{
		{"sbx-a", "a.test", "200", ""}, {"sbx-a", "b.test", "403", "not_allowlisted"},
		{"sbx-b", "b.test", "200", ""}, {"sbx-b", "a.test", "403", "not_allowlisted"},
		{"sbx-c", "a.test", "200", ""}, {"sbx-c", "b.test", "403", "not_allowlisted"},
	}
	for _, c := range cases {
		if status, reason := w.curl(t, c.sandbox, c.host); status != c.status || reason != c.reason {
			t.Errorf("%s -> %s: %s %q, want %s %q", c.sandbox, c.host, status, reason, c.status, c.reason)
		}
	}
	bearer := func(name string) string { return "Bearer " + w.secrets[name] }
	if got, want := w.up.authsFor("a.test"), []string{bearer("a"), bearer("node")}; !slices.Equal(got, want) {
		t.Errorf("a.test saw %q, want A's then the node's (C's scope) credential %q", got, want)
	}
	if got, want := w.up.authsFor("b.test"), []string{bearer("b")}; !slices.Equal(got, want) {
		t.Errorf("b.test saw %q, want B's credential only %q", got, want)
	}
	bySandbox := map[string][]string{}
	for _, l := range w.e.EgressLines() {
		bySandbox[l.Str("sandbox")] = append(bySandbox[l.Str("sandbox")], l.Str("host")+" "+l.Str("decision"))
	}
	for _, c := range cases {
		want := c.host + " allow"
		if c.reason != "" {
			want = c.host + " deny"
		}
		if !slices.Contains(bySandbox[c.sandbox], want) {
			t.Errorf("no egress line %q with sandbox %s: %v", want, c.sandbox, bySandbox)
		}
	}
}

// A sandbox's listener exists only inside its namespace: egressd's own namespace
// has nothing on that port, and from a sandbox neither the admin listener nor
// anything but its own listener answers. The API is a 0600 socket in a 0700
// directory.
func (w *world) isolation(t *testing.T) {
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+transparentPort, time.Second); err == nil {
		c.Close()
		t.Errorf("a sandbox listener answers in egressd's own namespace")
	}
	_, adminPort, _ := net.SplitHostPort(w.e.Admin)
	for _, sb := range []string{"sbx-a", "sbx-b"} {
		if err := dialIn(sb, "127.0.0.1:"+adminPort); err == nil {
			t.Errorf("%s reached the admin listener's port", sb)
		}
	}
	w.checkAPIModes(t)
	_, a := w.get(t, "sbx-a")
	if a["netns"] != "/run/netns/sbx-a" || a["listeners"].(map[string]any)["transparent"] != "127.0.0.1:"+transparentPort {
		t.Errorf("GET sbx-a: %v", a)
	}
	if ph, _ := a["env"].(map[string]any)["TOKEN"].(string); !strings.HasPrefix(ph, "egressd_ph_") {
		t.Errorf("GET sbx-a: env %v, want TOKEN's placeholder", a["env"])
	}
}

// checkAPIModes: the API is a path socket, 0600, in a 0700 directory, not an
// abstract one (which its network namespace alone would scope): another user
// gets EACCES from its directory and its mode.
func (w *world) checkAPIModes(t *testing.T) {
	t.Helper()
	for p, want := range map[string]os.FileMode{w.socket: 0o600 | os.ModeSocket, filepath.Dir(w.socket): 0o700 | os.ModeDir} {
		if fi, err := os.Stat(p); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode(), err, want)
		}
	}
}

// dialIn connects to addr from inside sandbox name's namespace.
func dialIn(name, addr string) error {
	return netns.Do("/run/netns/"+name, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// A spec with an error is answered 400 with every problem, and the sandbox keeps
// serving what it had.
func (w *world) badSpec(t *testing.T) {
	const bad = `{"listeners": [{"name": "t", "address": "127.0.0.1"}], "environment": {"network": {"allowlist": [{"domain": "a..b"}]}}}`
	code, body := w.put(t, "sbx-a", bad)
	if code != http.StatusBadRequest || !strings.Contains(body, `"path":"listeners[0].address"`) || !strings.Contains(body, `"path":"environment.network.allowlist[0].domain"`) {
		t.Errorf("PUT a bad spec: %d %s", code, body)
	}
	if check := w.check(t, "sbx-a", bad); check != body {
		t.Errorf("check --sandbox says\n%s\nthe API\n%s", check, body)
	}
	if status, _ := w.curl(t, "sbx-a", "a.test"); status != "200" {
		t.Errorf("after a refused spec, sbx-a -> a.test: %s, want 200", status)
	}
	if code, got := w.get(t, "sbx-a"); code != 200 || !strings.Contains(fmt.Sprint(got["problems"]), "listeners[0].address") {
		t.Errorf("GET sbx-a after the refused spec: %d %v", code, got["problems"])
	}
}

// held is a spliced tunnel held open by a long response.
type held struct {
	closed chan time.Time
}

// hold opens a tunnel from inside sandbox name to host, through the REDIRECT, and
// reads the start of a response the upstream then holds open.
func (w *world) hold(t *testing.T, name, host string) *held {
	t.Helper()
	var c net.Conn
	err := netns.Do("/run/netns/"+name, func() (err error) {
		c, err = net.DialTimeout("tcp", sandboxDst+":443", 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: w.up.roots()})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(tc, "GET /hold HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s -> %s /hold: %v %v", name, host, resp, err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, host) {
		t.Fatalf("%s -> %s /hold: %q %v", name, host, line, err)
	}
	tc.SetDeadline(time.Time{})
	h := &held{closed: make(chan time.Time, 1)}
	go func() {
		io.Copy(io.Discard, resp.Body)
		h.closed <- time.Now()
	}()
	return h
}

// closedWithin reports whether the tunnel closed within d.
func (h *held) closedWithin(d time.Duration) bool {
	select {
	case <-h.closed:
		return true
	case <-time.After(d):
		return false
	}
}

// B's spec file loses c.test: within 5 s its open tunnel to c.test is closed
// (policy_reload), while A's tunnel to the same host stays open.
func (w *world) changedFile(t *testing.T, bFile string) {
	tb, ta := w.hold(t, "sbx-b", "c.test"), w.hold(t, "sbx-a", "c.test")
	writeSpec(t, bFile, spec("sbx-b", filepath.Join(w.dir, "b-creds.json"), "b.test+key"))
	if !tb.closedWithin(5 * time.Second) {
		t.Fatal("sbx-b's tunnel to c.test is still open 5s after its spec file dropped c.test")
	}
	if ta.closedWithin(500 * time.Millisecond) {
		t.Error("sbx-a's tunnel closed when sbx-b's spec changed")
	}
	line := w.e.WaitLineT(t, "sbx-b's policy_reload line", func(l egressdtest.Line) bool {
		return l.Message() == "egress" && l.Str("detail") == "policy_reload"
	})
	if line.Str("sandbox") != "sbx-b" || line.Str("host") != "c.test" {
		t.Errorf("policy_reload line: %v", line)
	}
	if status, reason := w.curl(t, "sbx-b", "c.test"); status != "403" || reason != "not_allowlisted" {
		t.Errorf("sbx-b -> c.test after the change: %s %s", status, reason)
	}
}

// Removing C closes its open tunnel within 1 s and touches no other sandbox's.
func (w *world) removal(t *testing.T) {
	tc, ta := w.hold(t, "sbx-c", "c.test"), w.hold(t, "sbx-a", "c.test")
	start := time.Now()
	if code := w.del(t, "sbx-c"); code != http.StatusNoContent {
		t.Fatalf("DELETE sbx-c: %d", code)
	}
	if !tc.closedWithin(time.Second - time.Since(start)) {
		t.Fatal("sbx-c's tunnel is still open 1s after DELETE")
	}
	if ta.closedWithin(500 * time.Millisecond) {
		t.Error("sbx-a's tunnel closed when sbx-c was removed")
	}
	if code := w.del(t, "sbx-c"); code != http.StatusNotFound {
		t.Errorf("DELETE sbx-c again: %d, want 404", code)
	}
	if err := dialIn("sbx-c", "127.0.0.1:"+transparentPort); err == nil {
		t.Error("sbx-c's listener still answers after DELETE")
	}
	if status, _ := w.curl(t, "sbx-a", "a.test"); status != "200" {
		t.Errorf("sbx-a -> a.test after sbx-c's removal: %s", status)
	}
}

// A hook call from sbx-a's runtime carries an assertion with sbx-a's ID in its
// sandbox claim: it verifies against the node's JWKS for sbx-a, and not for sbx-b.
func (w *world) hookClaim(t *testing.T) {
	out, err := exec.Command("ip", "netns", "exec", "sbx-a", "curl", "-s", "-m", "10", "--cacert", w.bundle,
		"-x", "http://127.0.0.1:15003", "-H", "Content-Type: application/json", "-d", `{"tool_name": "bash"}`,
		"https://a.test/hook").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"allow"`) {
		t.Fatalf("the hook call: %v %s", err, out)
	}
	// The same call from the sandbox's code (another UID than the runtime's, the
	// listener's peer_uids) is closed at accept: no hook call, nothing signed.
	forged, err := exec.Command("ip", "netns", "exec", "sbx-a", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"curl", "-s", "-k", "-m", "10", "-x", "http://127.0.0.1:15003", "-H", "Content-Type: application/json",
		"-d", `{"tool_name": "bash"}`, "https://a.test/hook").CombinedOutput()
	if err == nil {
		t.Errorf("a hook call from the sandbox's UID was answered: %s", forged)
	}
	calls := w.up.hookCalls()
	if len(calls) != 1 {
		t.Fatalf("the endpoint saw %d hook calls, want 1 (the runtime's)", len(calls))
	}
	for _, sb := range []string{"sbx-a", "sbx-b"} {
		v, err := hookauth.NewVerifier(hookauth.Options{Audience: "https://a.test", Sandbox: sb,
			JWKSURL: "http://" + w.e.Admin + "/.well-known/jwks.json"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(t.Context(), calls[0].assertion, []byte(calls[0].body))
		switch {
		case sb == "sbx-a" && (err != nil || c.Sandbox != "sbx-a"):
			t.Errorf("verified for sbx-a: %v %+v", err, c)
		case sb == "sbx-b" && !errors.Is(err, hookauth.ErrSandbox):
			t.Errorf("verified for sbx-b: %v, want ErrSandbox", err)
		}
	}
}

// sbx-a's DNS guard answers inside its namespace: an allowlisted name with its
// address, another REFUSED (a guard on the sandbox's loopback has no sinkhole
// address: docs/transparent.md); its lines name the sandbox.
func (w *world) dnsGuard(t *testing.T) {
	if r := queryIn(t, "sbx-a", "a.test."); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != upstreamIP {
		t.Errorf("a.test: %v, want %s", r, upstreamIP)
	}
	if r := queryIn(t, "sbx-a", "b.test."); r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Errorf("b.test: %v, want REFUSED", r)
	}
	line := w.e.WaitLineT(t, "the DNS guard's line for b.test", func(l egressdtest.Line) bool {
		return l.Message() == "dns" && l.Str("name") == "b.test."
	})
	if line.Str("sandbox") != "sbx-a" {
		t.Errorf("dns line %v: no sandbox sbx-a", line)
	}
}

// queryIn asks the DNS guard on 127.0.0.1:15053 inside sandbox name for name's A
// records, over a socket made inside the sandbox's namespace.
func queryIn(t *testing.T, sandbox, name string) *dns.Msg {
	t.Helper()
	var c net.Conn
	if err := netns.Do("/run/netns/"+sandbox, func() (err error) {
		c, err = net.Dial("udp", "127.0.0.1:15053")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	co := &dns.Conn{Conn: c}
	if err := co.WriteMsg(new(dns.Msg).SetQuestion(name, dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	r, err := co.ReadMsg()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// Each sandbox's placeholder is replaced with its own value; another sandbox's,
// sent from sbx-a, reaches the upstream as the worthless string it is.
func (w *world) placeholders(t *testing.T) {
	ph := map[string]string{}
	for _, sb := range []string{"sbx-a", "sbx-b"} {
		_, info := w.get(t, sb)
		ph[sb], _ = info["env"].(map[string]any)["TOKEN"].(string)
	}
	if ph["sbx-a"] == "" || ph["sbx-a"] == ph["sbx-b"] {
		t.Fatalf("placeholders %v: want one per sandbox", ph)
	}
	for _, p := range []string{ph["sbx-a"], ph["sbx-b"]} {
		if status, reason := w.curlPath(t, "sbx-a", "a.test", "/", "-H", "X-Token: "+p); status != "200" {
			t.Errorf("sbx-a -> a.test with X-Token %s: %s %s", p, status, reason)
		}
	}
	got, want := w.up.tokens(), []string{w.secrets["a"] + "-ph", ph["sbx-b"]}
	if !slices.Equal(got, want) {
		t.Errorf("a.test saw X-Token %q, want sbx-a's value, then sbx-b's placeholder unreplaced", got)
	}
}

// check runs `egressd check --format json --sandbox` on spec, written as id.json,
// and returns its problems as the API writes them.
func (w *world) check(t *testing.T, id, spec string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), id+".json")
	if err := os.WriteFile(file, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(egressdtest.Binary(), "check", "--format", "json", "--config", w.e.ConfigPath, "--sandbox", file).Output()
	var rep struct {
		Problems json.RawMessage `json:"problems"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("check --sandbox printed %s: %v", out, err)
	}
	var compact bytes.Buffer
	json.Compact(&compact, rep.Problems)
	return `{"problems":` + compact.String() + "}\n"
}
