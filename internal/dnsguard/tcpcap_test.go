package dnsguard_test

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/testutil/procfs"
)

// tcpClient is one client TCP connection to the guard, from a chosen loopback address.
type tcpClient struct {
	*dns.Conn
}

// dialFrom connects to the guard from src (an address of 127.0.0.0/8, which lo
// answers for in full), without waiting for anything.
func (w *world) dialFrom(t *testing.T, src string) *tcpClient {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := d.Dial("tcp", w.guard.Addr())
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	nc.(*net.TCPConn).SetLinger(0) // reset on close: no TIME_WAIT left behind
	c := &tcpClient{&dns.Conn{Conn: nc}}
	t.Cleanup(func() { c.Close() })
	return c
}

// query sends one A query for api.example.com and waits up to d for its answer.
// It returns nil and the error when the guard closed the connection instead.
func (c *tcpClient) query(d time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion("api.example.com.", dns.TypeA)
	c.SetDeadline(time.Now().Add(d))
	if err := c.WriteMsg(m); err != nil {
		return nil, err
	}
	return c.ReadMsg()
}

// closedByPeer reports whether err says the guard closed or reset the connection
// (rather than a timeout on our side).
func closedByPeer(err error) bool {
	var ne net.Error
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || !errors.As(err, &ne) || !ne.Timeout())
}

// hold opens a connection from src whose first query is answered: it then sits idle
// and counts against the caps.
func (w *world) hold(t *testing.T, src string) *tcpClient {
	t.Helper()
	c := w.dialFrom(t, src)
	if _, err := c.query(3 * time.Second); err != nil {
		t.Fatalf("a connection from %s within the caps: %v", src, err)
	}
	return c
}

// assertRefused asserts that a new connection from src is closed at once: its query
// gets no answer, and the close comes well before any timeout of the guard's.
func (w *world) assertRefused(t *testing.T, src string) {
	t.Helper()
	start := time.Now()
	resp, err := w.dialFrom(t, src).query(3 * time.Second)
	if resp != nil || !closedByPeer(err) {
		t.Fatalf("a connection from %s over the cap: answer %v, err %v; want it closed", src, resp, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("closed after %s, want at once", took)
	}
}

func capWorld(t *testing.T, total, perClient int, idle time.Duration) *world {
	return newWorld(t, func(o *dnsguard.Options) {
		o.MaxTCPConnections, o.MaxTCPPerClient, o.TCPIdle = total, perClient, idle
		o.RatePerSecond, o.Burst = 1e6, 1e6 // the flood is about connections, not queries
	})
}

// TestTCPPerClientAndTotalCaps: connections beyond dns.max_tcp_per_client from one
// IP, or beyond dns.max_tcp_connections in all, are closed at once; other clients and
// UDP are served meanwhile; a closed connection gives its slot back.
func TestTCPPerClientAndTotalCaps(t *testing.T) {
	w := capWorld(t, 6, 3, time.Minute)
	var held []*tcpClient
	for range 3 {
		held = append(held, w.hold(t, "127.0.0.1"))
	}
	w.assertRefused(t, "127.0.0.1")
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
	for range 3 {
		held = append(held, w.hold(t, "127.0.0.2")) // another client has its own share
	}
	w.assertRefused(t, "127.0.0.3") // the total is reached
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")

	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := w.dialFrom(t, "127.0.0.3")
		if _, err := c.query(2 * time.Second); err == nil {
			break // the freed slot is taken
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's slot was never given back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if log := w.logs.String(); !strings.Contains(log, `"reason":"tcp_connection_limit"`) {
		t.Errorf("no log line for a connection closed by a cap:\n%s", log)
	}
}

// TestTCPFloodBounded: a client that tries to hold many more TCP connections than
// the cap costs the guard no more than the cap in goroutines and descriptors, and
// UDP queries are answered throughout.
func TestTCPFloodBounded(t *testing.T) {
	const limit, flood = 16, 400
	w := capWorld(t, limit, limit, time.Minute)
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
	fds0, err := procfs.FDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	g0 := runtime.NumGoroutine()

	answered := 0
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < flood && time.Now().Before(deadline); i++ {
		c := w.dialFrom(t, "127.0.0.1")
		if _, err := c.query(3 * time.Second); err == nil {
			answered++ // held: it stays open until the test ends
		} else {
			c.Close() // closed by the guard; our side of it goes too
		}
		if i%100 == 0 {
			wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
		}
	}
	if answered != limit {
		t.Errorf("%d of %d connections were served and held, want the cap %d", answered, flood, limit)
	}
	fds, err := procfs.FDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Each held connection is two descriptors here (the client's and the guard's)
	// and one guard goroutine; allow some slack for the runtime and the test.
	if extra := fds - fds0; extra > 2*limit+16 {
		t.Errorf("%d more descriptors while %d connections are held, want at most %d", extra, limit, 2*limit+16)
	}
	if extra := runtime.NumGoroutine() - g0; extra > limit+16 {
		t.Errorf("%d more goroutines while %d connections are held, want at most %d", extra, limit, limit+16)
	}
	rss, _ := procfs.RSS(os.Getpid())
	t.Logf("flood of %d: %d held, +%d fds, +%d goroutines, RSS %d MiB (test and guard)", flood, answered, fds-fds0,
		runtime.NumGoroutine()-g0, rss>>20)
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
}

// TestTCPIdleAndQueryCount: a connection with no query for dns.tcp_idle is closed,
// and so is one that has carried dns.tcp_max_queries.
func TestTCPIdleAndQueryCount(t *testing.T) {
	const idle = 500 * time.Millisecond
	w := newWorld(t, func(o *dnsguard.Options) { o.TCPIdle, o.TCPMaxQueries = idle, 3 })
	t.Run("idle", func(t *testing.T) {
		c := w.hold(t, "127.0.0.1")
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.ReadMsg()
		took := time.Since(start)
		if !closedByPeer(err) || took < idle/2 || took > idle+2*time.Second {
			t.Fatalf("an idle connection ended after %s with %v, want closed by the guard after about %s", took, err, idle)
		}
	})
	t.Run("max queries", func(t *testing.T) {
		c := w.dialFrom(t, "127.0.0.1")
		for i := range 3 {
			if _, err := c.query(3 * time.Second); err != nil {
				t.Fatalf("query %d: %v", i+1, err)
			}
		}
		if resp, err := c.query(3 * time.Second); resp != nil || !closedByPeer(err) {
			t.Fatalf("a 4th query on one connection: answer %v, err %v; want the connection closed", resp, err)
		}
	})
}
