package main

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// benchZone is the DNS zone the stub answers: every name in it (the intercepted
// paths' hosts) is 127.0.0.1. egressd decides interception per allowlist entry,
// so each intercepted path needs a host of its own, and only localhost resolves
// without DNS (/etc/hosts).
const benchZone = "bench.test"

// dnsStartTimeout bounds the wait for the stub's two servers to be up.
const dnsStartTimeout = 5 * time.Second

// dnsStub is the resolver egressd is pointed at (network.resolver): a DNS
// server on 127.0.0.1, UDP and TCP on one port, that answers A queries for
// benchZone with 127.0.0.1, AAAA queries there with no records, and every
// other name with NXDOMAIN. It never forwards a query, so no DNS traffic
// leaves the machine. egressd still reads /etc/hosts first, so localhost
// does not reach it.
type dnsStub struct {
	addr    string // 127.0.0.1:port
	queries atomic.Int64
	servers []*dns.Server
	// pinned maps names (lower case, no final dot) the stub answers with
	// another address than 127.0.0.1 (the transparent path's stand-in).
	pinned sync.Map
}

func startDNS() (*dnsStub, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return nil, err
	}
	s := &dnsStub{addr: pc.LocalAddr().String()}
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	s.servers = []*dns.Server{
		{PacketConn: pc, Handler: s, NotifyStartedFunc: notify},
		{Listener: ln, Handler: s, NotifyStartedFunc: notify},
	}
	for _, srv := range s.servers {
		go func() { _ = srv.ActivateAndServe() }()
	}
	timeout := time.NewTimer(dnsStartTimeout)
	defer timeout.Stop()
	for range s.servers {
		select {
		case <-started:
		case <-timeout.C:
			pc.Close()
			ln.Close()
			return nil, errors.New("DNS stub did not start")
		}
	}
	return s, nil
}

func (s *dnsStub) close() {
	for _, srv := range s.servers {
		_ = srv.Shutdown()
	}
}

// ServeDNS answers one query; see dnsStub.
func (s *dnsStub) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	s.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	switch {
	case !inBenchZone(q.Name):
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA && q.Qclass == dns.ClassINET:
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   s.addrOf(q.Name),
		})
	}
	_ = w.WriteMsg(m)
}

// pin makes the stub answer name's A queries with ip instead of 127.0.0.1.
func (s *dnsStub) pin(name string, ip net.IP) {
	s.pinned.Store(strings.TrimSuffix(strings.ToLower(name), "."), ip)
}

// addrOf is the A record of name, a name in benchZone.
func (s *dnsStub) addrOf(name string) net.IP {
	if ip, ok := s.pinned.Load(strings.TrimSuffix(strings.ToLower(name), ".")); ok {
		return ip.(net.IP)
	}
	return net.IPv4(127, 0, 0, 1)
}

// inBenchZone reports whether name (fully qualified or not) is benchZone or
// under it.
func inBenchZone(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	return name == benchZone || strings.HasSuffix(name, "."+benchZone)
}
