package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/netguard"
)

// TestTransparentSinkhole: in a sandbox made by deploy/netns/egressd-netns,
// with the DNS guard sinkholing names off the allowlist (dns.refused_names:
// sinkhole, the default), a client asking for https://evil.test/ or
// http://evil.test/ gets egressd's own address on the sandbox's link for the
// name, connects there (the sandbox's REDIRECT takes it to the transparent
// listener) and reads the 403 with Egressd-Reason not_allowlisted: curl as a
// user runs it, and Go's client trusting egressd's CA. The name is never
// resolved upstream, and nothing is dialled: not the sinkhole address (a
// canary of egressd's own address on 80 and 443 counts), not anything else.
func TestTransparentSinkhole(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: injectEntries[:2]}) // no "*"
	sb := w.serveTransparent(t)
	dnsLog := &syncBuffer{}
	startGuard(t, w, sb, dnsguard.Options{Sinkhole: true, Log: zerolog.New(dnsLog)})
	own := countAccepts(t, sb.hostIP, "80", "443")
	caFile := filepath.Join(t.TempDir(), "egressd-ca.pem")
	if err := os.WriteFile(caFile, w.CA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	roots := w.CAPool.Clone() // and the upstream's, for the allowlisted name egressd splices
	roots.AppendCertsFromPEM(w.upstreamCAPEM)
	goClient := sandboxClient(sb, roots)

	for _, url := range []string{"https://evil.test/", "http://evil.test/"} {
		t.Run("curl "+url, func(t *testing.T) {
			status, reason := curlIn(t, sb, caFile, url)
			if status != 403 || reason != "not_allowlisted" {
				t.Fatalf("curl %s: %d, Egressd-Reason %q; want 403 not_allowlisted\n%s", url, status, reason, dnsLog.Bytes())
			}
		})
		t.Run("Go "+url, func(t *testing.T) {
			resp, err := goClient.Get(url)
			if err != nil {
				t.Fatalf("GET %s: %v\n%s", url, err, dnsLog.Bytes())
			}
			assertRefused(t, resp, 403, "not_allowlisted", "")
		})
	}
	t.Run("an allowlisted name still resolves and is served", func(t *testing.T) {
		resp, err := goClient.Get("https://www.allowed.test/through-the-guard")
		if err != nil {
			t.Fatal(err)
		}
		if got := decodeEcho(t, resp); got.Host != "www.allowed.test" {
			t.Errorf("reached %q", got.Host)
		}
	})

	sinkholed := dnsLines(dnsLog, "evil.test.", "A")
	if len(sinkholed) == 0 {
		t.Fatalf("no dns line for evil.test A:\n%s", dnsLog.Bytes())
	}
	for _, l := range sinkholed {
		if l["answer"] != "sinkhole" || l["reason"] != "not_allowlisted" || l["rcode"] != "NOERROR" || l["answers"] != 1.0 {
			t.Errorf("dns line %v, want answer sinkhole, reason not_allowlisted, NOERROR, 1 answer", l)
		}
	}
	for _, l := range w.logLines() {
		if l["host"] == "evil.test" && (l["reason"] != "not_allowlisted" || l["resolved_ip"] != "") {
			t.Errorf("egress line %v, want not_allowlisted and nothing resolved", l)
		}
	}
	if n := w.DNS.Queries("evil.test"); n != 0 {
		t.Errorf("evil.test was resolved upstream %d times", n)
	}
	if n := own.Load(); n != 0 {
		t.Errorf("egressd dialled its own (sinkhole) address %d times", n)
	}
	w.assertNoCanaryHit()
}

// startGuard serves a DNS guard for sb on its host address, port 15053 (where the
// sandbox's port 53 goes), answering from w's policy through w's stub resolver.
func startGuard(t *testing.T, w *world, sb *sandbox, o dnsguard.Options) {
	t.Helper()
	o.Listen = sb.hostIP + ":15053"
	o.Policy = func() *allowlist.Policy { return w.Server.Snapshot().Policy }
	o.Resolver = netguard.NewResolver(w.DNS.Addr, time.Second)
	o.Guard = w.Server.Snapshot().Guard
	g := dnsguard.New(o)
	if err := g.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go g.Run(ctx)
	t.Cleanup(cancel)
}

// countAccepts listens on ip at each port and counts the connections made to
// them; connections from the sandbox are redirected away before they get there,
// so only egressd's own dials could.
func countAccepts(t *testing.T, ip string, ports ...string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	for _, port := range ports {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				n.Add(1)
				c.Close()
			}
		}()
	}
	return &n
}

// curlIn runs curl inside the sandbox (ip netns exec, which also gives it the
// sandbox's resolv.conf: the host-side address, port 53), as a user would, HTTP/2
// offered over TLS, and returns the response's status and Egressd-Reason.
func curlIn(t *testing.T, sb *sandbox, caFile, url string) (int, string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", sb.name, "curl", "--silent", "--show-error",
		"--max-time", "10", "--cacert", caFile, "--output", "/dev/null",
		"--write-out", "%{http_code} %header{egressd-reason}", url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s: %v\n%s", url, err, out)
	}
	code, reason, _ := strings.Cut(string(out), " ")
	status, err := strconv.Atoi(code)
	if err != nil {
		t.Fatalf("curl %s wrote %q", url, out)
	}
	return status, reason
}

// sandboxClient is a Go HTTP client whose connections and DNS queries are made
// inside the sandbox: names resolve through the sandbox's port 53, as its
// resolv.conf says, and it trusts roots.
func sandboxClient(sb *sandbox, roots *x509.CertPool) *http.Client {
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dialIn(ctx, sb.name, network, net.JoinHostPort(sb.hostIP, "53"))
	}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := resolver.LookupNetIP(ctx, "ip4", host)
		if err != nil {
			return nil, err
		}
		return dialIn(ctx, sb.name, network, net.JoinHostPort(ips[0].String(), port))
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true,
	}}
}

// dialIn connects to addr from inside the network namespace ns: the socket is
// made on an OS thread that has joined it. Unlike sandbox.dial it returns its
// errors, since http.Transport dials on goroutines of its own.
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer home.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	c, dialErr := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked in the sandbox and dies with its goroutine.
		return nil, errors.Join(dialErr, err)
	}
	runtime.UnlockOSThread()
	return c, dialErr
}

// dnsLines are the guard's "dns" lines for name and qtype.
func dnsLines(log *syncBuffer, name, qtype string) []map[string]any {
	var out []map[string]any
	for _, line := range log.Lines() {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "dns" && m["name"] == name && m["qtype"] == qtype {
			out = append(out, m)
		}
	}
	return out
}
