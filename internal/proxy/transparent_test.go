package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/netguard"
)

// sandbox is a network namespace made by deploy/netns/egressd-netns, the same
// script a user runs, inside the test's own isolated namespace: its only way out is
// egressd's transparent listener and DNS guard on the host side of its veth.
type sandbox struct {
	name   string
	hostIP string // egressd listens here
}

var sandboxes atomic.Int32

const netnsScript = "../../deploy/netns/egressd-netns"

func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	n := sandboxes.Add(1)
	sb := &sandbox{name: fmt.Sprintf("tp%d", n), hostIP: fmt.Sprintf("10.200.%d.1", n)}
	env := append(os.Environ(), fmt.Sprintf("EGRESSD_NETNS_INDEX=%d", n),
		"EGRESSD_TPROXY_PORT=15002", "EGRESSD_DNS_PORT=15053")
	script := func(verb string) error {
		cmd := exec.Command(netnsScript, verb, sb.name)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("egressd-netns %s %s: %v\n%s", verb, sb.name, err, out)
		}
		return nil
	}
	if err := script("up"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := script("down"); err != nil {
			t.Error(err)
		}
	})
	return sb
}

// dial connects from inside the sandbox: the socket is made on an OS thread that
// has joined the sandbox's network namespace.
func (sb *sandbox) dial(t *testing.T, network, addr string) (net.Conn, error) {
	t.Helper()
	target, err := os.Open("/run/netns/" + sb.name)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	runtime.LockOSThread()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	c, dialErr := net.DialTimeout(network, addr, 2*time.Second)
	if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatalf("restoring the thread's namespace: %v", err) // the thread stays locked and dies
	}
	runtime.UnlockOSThread()
	return c, dialErr
}

// transparentWorld is a world whose proxy also serves a transparent listener and
// a DNS guard for one sandbox.
// serveTransparent serves a transparent sandbox listener on a new sandbox's
// host address, port 15002, and returns the sandbox.
func (w *world) serveTransparent(t *testing.T) *sandbox {
	t.Helper()
	sb := newSandbox(t)
	ln, err := net.Listen("tcp", sb.hostIP+":15002")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go w.Server.Serve(ln, config.Listener{Name: "transparent", Mode: config.ModeTransparent, Role: config.RoleSandbox})
	return sb
}

func newTransparentWorld(t *testing.T) (*world, *sandbox) {
	w := newInjectWorld(t, worldOpts{allowlist: injectEntries[:2]}) // no "*"
	sb := w.serveTransparent(t)
	guard := dnsguard.New(dnsguard.Options{
		Listen:   sb.hostIP + ":15053",
		Policy:   func() *allowlist.Policy { return w.Server.Snapshot().Policy },
		Resolver: netguard.NewResolver(w.DNS.Addr, time.Second),
		Guard:    w.Server.Snapshot().Guard,
	})
	if err := guard.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go guard.Run(ctx)
	t.Cleanup(cancel)
	return w, sb
}

// tlsFromSandbox opens a TLS connection from the sandbox to addr (any address: the
// sandbox's choice) with the given SNI, trusting egressd's CA.
func (w *world) tlsFromSandbox(t *testing.T, sb *sandbox, addr, sni string) (*tls.Conn, error) {
	t.Helper()
	c, err := sb.dial(t, "tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	pool := w.CAPool.Clone()
	pool.AppendCertsFromPEM(w.upstreamCAPEM)
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: pool, NextProtos: []string{"http/1.1"}})
	return tc, tc.Handshake()
}

func get(t *testing.T, c net.Conn, host, path string) *http.Response {
	t.Helper()
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestTransparentMode(t *testing.T) {
	w, sb := newTransparentWorld(t)
	evil := startEchoOn(t, "93.184.216.250") // a non-allowlisted upstream the sandbox aims at
	upstream443 := w.PublicIP + ":443"

	t.Run("allowlisted HTTPS gets its injected header", func(t *testing.T) {
		tc, err := w.tlsFromSandbox(t, sb, upstream443, "api.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		resp := get(t, tc, "api.allowed.test", "/v1")
		if resp.StatusCode != 200 {
			t.Logf("egressd log: %s", w.logs.Bytes())
		}
		got := decodeEcho(t, resp)
		if got.Header.Get("Authorization") != "Bearer "+secretMark {
			t.Errorf("upstream saw Authorization %q", got.Header.Get("Authorization"))
		}
	})
	t.Run("non-allowlisted SNI is completed and answered 403", func(t *testing.T) {
		tc, err := w.tlsFromSandbox(t, sb, upstream443, "evil.test")
		if err != nil {
			t.Fatal(err)
		}
		assertRefused(t, get(t, tc, "evil.test", "/"), 403, "not_allowlisted", "")
	})
	t.Run("allowlisted SNI to a non-allowlisted IP reaches the allowlisted host", func(t *testing.T) {
		before := evil.requests.Load()
		tc, err := w.tlsFromSandbox(t, sb, "93.184.216.250:443", "www.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		got := decodeEcho(t, get(t, tc, "www.allowed.test", "/fronted"))
		if got.Host != "www.allowed.test" {
			t.Errorf("reached %q", got.Host)
		}
		if evil.requests.Load() != before || evil.accepts.Load() != 0 {
			t.Error("the address the sandbox chose was dialled")
		}
	})
	t.Run("no SNI is refused", func(t *testing.T) {
		c, err := sb.dial(t, "tcp", upstream443)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		err = tls.Client(c, &tls.Config{InsecureSkipVerify: true}).Handshake()
		if err == nil {
			t.Fatal("handshake without SNI succeeded")
		}
		w.waitLog(t, func(l map[string]any) bool {
			return l["listener"] == "transparent" && l["reason"] == "bad_request" && l["detail"] == "no_sni"
		})
	})
	t.Run("plain HTTP is decided on the Host header", func(t *testing.T) {
		c, err := sb.dial(t, "tcp", w.PublicIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if got := decodeEcho(t, get(t, c, "www.allowed.test", "/plain")); got.Host != "www.allowed.test" {
			t.Errorf("reached %q", got.Host)
		}
		c2, err := sb.dial(t, "tcp", w.PublicIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		c2.SetDeadline(time.Now().Add(5 * time.Second))
		assertRefused(t, get(t, c2, "evil.test", "/"), 403, "not_allowlisted", "")
	})
	t.Run("a Host naming another port is host_mismatch, saying only the port differs", func(t *testing.T) {
		c, err := sb.dial(t, "tcp", w.PublicIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		rb := assertRefused(t, get(t, c, "www.allowed.test:8080", "/"), 421, "host_mismatch", "port")
		if rb.Port != 80 || !strings.Contains(rb.Message, "www.allowed.test:80 (only the port differs)") {
			t.Errorf("port %d, message %q; want the connection's port 80 and that only the port differs", rb.Port, rb.Message)
		}
	})
	t.Run("a direct connection to another port is dropped", func(t *testing.T) {
		if c, err := sb.dial(t, "tcp", "93.184.216.250:22"); err == nil {
			c.Close()
			t.Fatal("connected to port 22")
		}
		if evil.accepts22.Load() != 0 {
			t.Error("port 22 saw a connection")
		}
	})
	t.Run("UDP goes nowhere", func(t *testing.T) {
		c, err := sb.dial(t, "udp", "93.184.216.250:9999")
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("exfil"))
		c.Close()
		time.Sleep(200 * time.Millisecond)
		if n := evil.udp.Load(); n != 0 {
			t.Errorf("UDP listener received %d packet(s)", n)
		}
	})
	t.Run("DNS: allowlisted name answered, others refused", func(t *testing.T) {
		ask := func(name string) *dns.Msg {
			c, err := sb.dial(t, "udp", sb.hostIP+":53")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			co := &dns.Conn{Conn: c}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if err := co.WriteMsg(m); err != nil {
				t.Fatal(err)
			}
			r, err := co.ReadMsg()
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := ask("www.allowed.test"); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Errorf("allowlisted name: rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		before := w.DNS.Queries("secret-data.evil.test")
		if r := ask("secret-data.evil.test"); r.Rcode != dns.RcodeRefused {
			t.Errorf("not allowlisted: rcode %s", dns.RcodeToString[r.Rcode])
		}
		if w.DNS.Queries("secret-data.evil.test") != before {
			t.Error("a refused name was forwarded")
		}
	})
	w.assertNoCanaryHit()
}

// evilUpstream counts whatever reaches an address the sandbox aims at but may not reach.
type evilUpstream struct {
	requests, accepts, accepts22, udp atomic.Int64
}

func startEchoOn(t *testing.T, ip string) *evilUpstream {
	e := &evilUpstream{}
	for _, port := range []string{"443", "22"} {
		ln := listenOn(t, net.JoinHostPort(ip, port))
		counter := &e.accepts
		if port == "22" {
			counter = &e.accepts22
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				counter.Add(1)
				e.requests.Add(1)
				c.Close()
			}
		}()
	}
	pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, "9999"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			e.udp.Add(1)
		}
	}()
	return e
}
