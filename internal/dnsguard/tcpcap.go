package dnsguard

import (
	"net"
	"net/netip"
	"sync"
)

// reasonTCPCap is the log reason of a TCP connection closed on accept because the
// guard already holds dns.max_tcp_connections, or the client dns.max_tcp_per_client.
const reasonTCPCap = reason("tcp_connection_limit")

// capListener closes, as soon as they are accepted, the TCP connections beyond a total
// cap and a per-client-IP cap. Closing at once, rather than leaving them in the
// backlog as golang.org/x/net/netutil.LimitListener does, means a flood costs the
// guard nothing it keeps: no goroutine, no buffer, no file descriptor past the close,
// and the client learns at once (and so does a honest one, which retries over UDP).
type capListener struct {
	net.Listener
	total, perClient int
	refused          func(client netip.Addr) // called for each connection closed on accept

	mu       sync.Mutex
	open     int
	byClient map[netip.Addr]int
}

func newCapListener(ln net.Listener, total, perClient int, refused func(netip.Addr)) *capListener {
	return &capListener{Listener: ln, total: total, perClient: perClient, refused: refused, byClient: map[netip.Addr]int{}}
}

// Accept returns the next connection within the caps; the others are closed.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := addrOf(c.RemoteAddr())
		if l.admit(ip) {
			return &capConn{Conn: c, release: func() { l.release(ip) }}, nil
		}
		c.Close()
		l.refused(ip)
	}
}

// admit counts a connection from ip in, unless a cap is reached.
func (l *capListener) admit(ip netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.total || l.byClient[ip] >= l.perClient {
		return false
	}
	l.open++
	l.byClient[ip]++
	return true
}

func (l *capListener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byClient[ip]--; l.byClient[ip] <= 0 {
		delete(l.byClient, ip)
	}
}

// capConn gives its slot back on its first Close.
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
