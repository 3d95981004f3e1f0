package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/testpki"
)

// These tests hold a connection open through `egressd run` across a reload and a
// credential revocation: what the new state still allows stays up, what it refuses
// is closed and logged with the new reason and detail policy_reload.

// endWithin is how soon after egressd has the new state a refused open connection
// must be closed.
const endWithin = time.Second

// openConn is one open connection through egressd, and the bufio.Reader over it.
type openConn struct {
	net.Conn
	br *bufio.Reader
}

// dialProxy connects to egressd's sandbox listener.
func (d *runner) dialProxy() net.Conn {
	d.t.Helper()
	nc, err := net.DialTimeout("tcp", d.Proxy, waitTimeout)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(waitTimeout))
	return nc
}

// tlsTunnel opens a CONNECT tunnel to localhost:port and TLS to the upstream
// itself through it, trusting pool.
func (d *runner) tlsTunnel(port int, pool *testpki.CA) *openConn {
	d.t.Helper()
	nc := d.dialProxy()
	br := bufio.NewReader(nc)
	fmt.Fprintf(nc, "CONNECT localhost:%d HTTP/1.1\r\nHost: localhost:%d\r\n\r\n", port, port)
	res, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || res.StatusCode != http.StatusOK || br.Buffered() > 0 {
		d.t.Fatalf("CONNECT localhost:%d: %v %v (%d bytes after the 200)", port, res, err, br.Buffered())
	}
	tc := tls.Client(nc, &tls.Config{ServerName: "localhost", RootCAs: pool.Pool})
	if err := tc.Handshake(); err != nil {
		d.t.Fatal(err)
	}
	return &openConn{Conn: tc, br: bufio.NewReader(tc)}
}

// echoGet sends GET path on c and checks that the echo upstream answered it.
func (c *openConn) echoGet(t *testing.T, path string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(waitTimeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path)
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("GET %s in the tunnel: %v", path, err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if echoedPath(string(body)) != path {
		t.Fatalf("GET %s in the tunnel: %d %q", path, res.StatusCode, body)
	}
}

// assertEnded checks that egressd closes c within within: a read ends in EOF or an
// error, not in the deadline.
func (c *openConn) assertEnded(t *testing.T, within time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("still open %v after the change of state", within)
	}
}

// endedLine waits for the egress line of the open connection (method) that the new
// state ended, and checks its reason and detail and the requests_total series.
func (d *runner) endedLine(method, decision, reason string) logLine {
	d.t.Helper()
	l := d.waitLog("egress line of the ended "+method, func(l logLine) bool {
		return l.Str("message") == "egress" && l.Str("method") == method && l.Str("reason") != ""
	})
	if l.Str("decision") != decision || l.Str("reason") != reason || l.Str("detail") != "policy_reload" {
		d.t.Errorf("egress line %v; want decision %s, reason %s, detail policy_reload", l, decision, reason)
	}
	series := fmt.Sprintf(`egressd_requests_total{decision=%q,listener="sandbox",reason=%q}`, decision, reason)
	if v := d.metric(series); v != 1 {
		d.t.Errorf("%s = %v, want 1", series, v)
	}
	return l
}

// TestReloadEndsOpenTunnel: a spliced tunnel through `egressd run` keeps working
// across a reload (POST /v1/reload) that keeps its host, and is closed within a
// second of one that removes it.
func TestReloadEndsOpenTunnel(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t)
	cert := ca.Leaf(t, "localhost")
	up := startUpstream(t, &cert)
	d, pol := startWithPolicy(t, allowOnly(up.port, "localhost", "127.0.0.1"), "")
	c := d.tlsTunnel(up.port, ca)
	c.echoGet(t, "/before")

	writeAtomic(t, pol, allowOnly(up.port, "localhost"))
	d.mustReload(http.StatusOK)
	c.echoGet(t, "/kept")

	logs := d.cursor()
	writeAtomic(t, pol, allowOnly(up.port, "127.0.0.1"))
	d.mustReload(http.StatusOK)
	c.assertEnded(t, endWithin)
	l := d.endedLine(http.MethodConnect, "deny", "not_allowlisted")
	if l.Str("host") != "localhost" || l.Num("bytes_out") == 0 {
		t.Errorf("egress line of the ended tunnel: %v", l)
	}
	logs.wait("the reload's summary", func(l logLine) bool {
		return strings.HasPrefix(l.Str("message"), "open connections the new policy refuses") && l.Num("closed") == 1
	})
}

// upgradeEcho answers an Upgrade: echo request with 101 and then echoes every byte:
// an upgraded protocol that is not WebSocket.
func upgradeEcho(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "echo" {
		http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
		return
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer nc.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	brw.Flush()
	io.Copy(nc, brw)
}

// upgraded opens an Upgrade: echo connection to url through egressd.
func (d *runner) upgraded(url string) *openConn {
	d.t.Helper()
	nc := d.dialProxy()
	br := bufio.NewReader(nc)
	fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
		url, strings.TrimPrefix(url, "http://"))
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		d.t.Fatalf("upgrade of %s: %v %v", url, res, err)
	}
	return &openConn{Conn: nc, br: br}
}

// echo sends msg on an upgraded connection and checks that it comes back. The
// connection carries a credential, so egressd scrubs what comes back: messages end
// in a byte that cannot begin an injected value's form, so none is held back.
func (c *openConn) echo(t *testing.T, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(waitTimeout))
	io.WriteString(c, msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c.br, got); err != nil || string(got) != msg {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// TestRevocationEndsOpenUpgradeAcrossReload: an upgraded connection that carries a credential
// survives its rotation and is closed once egressd reads its revocation, with the
// credential store egressd started with and with the one a reload built anew.
func TestRevocationEndsOpenUpgradeAcrossReload(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(upgradeEcho))
	t.Cleanup(up.Close)
	port := up.Listener.Addr().(*net.TCPAddr).Port
	policy := fmt.Sprintf(`{"allowlist": [{"domain": "localhost", "ports": [%d], "credential": "example-api", "allow_plaintext": true}]}`, port)
	d, pol := startWithPolicy(t, policy, "")
	creds := filepath.Join(filepath.Dir(d.ConfigPath), "credentials.json")
	url := fmt.Sprintf("http://localhost:%d/echo", port)
	setToken := func(token, status string) {
		t.Helper()
		writeAtomic(t, creds, fmt.Sprintf(`{"example-api": {"token": %q, "status": %q}}`, token, status))
	}
	credentialLine := func(logs *logCursor, msgs ...string) {
		t.Helper()
		logs.wait(strings.Join(msgs, " or "), func(l logLine) bool {
			return l.Str("credential") == "example-api" && slices.Contains(msgs, l.Str("message"))
		})
	}

	for i, when := range []string{"with the store egressd started with", "with a store a reload built"} {
		if i > 0 {
			logs := d.cursor()
			setToken("tok-good", "active")
			credentialLine(logs, "credential rotated", "credential recovered")
			// A new max_stale makes the reload build a new store.
			d.rewriteConfig(strings.Replace(fileConfig(pol, ""), "credentials: {file: credentials.json}",
				"credentials: {file: credentials.json, max_stale: 10m}", 1))
			d.mustReload(http.StatusOK)
		}
		c := d.upgraded(url)
		c.echo(t, "before.")
		logs := d.cursor()
		setToken(fmt.Sprintf("tok-rotated-%d", i), "active")
		credentialLine(logs, "credential rotated")
		c.echo(t, "kept.")
		setToken(fmt.Sprintf("tok-rotated-%d", i), "revoked")
		credentialLine(logs, "credential read failed")
		c.assertEnded(t, endWithin)
		l := d.waitNth("egress line of the ended upgrade", i+1, func(l logLine) bool {
			return l.Str("message") == "egress" && l.Num("status") == http.StatusSwitchingProtocols
		})
		if l.Str("reason") != "credential_unavailable" || l.Str("detail") != "policy_reload" || l.Str("credential") != "example-api" {
			t.Errorf("%s: egress line of the ended upgrade %v; want credential_unavailable, policy_reload, example-api", when, l)
		}
	}
}
