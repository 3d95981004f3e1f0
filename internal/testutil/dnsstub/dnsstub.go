// Package dnsstub is a programmable DNS server for tests (miekg/dns on loopback):
// each name answers with the records a test sets, and may change on every query.
package dnsstub

import (
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// Answer returns the records for one query of name; n counts the earlier queries of
// the same type for that name (0 for the first), which lets a test change answers
// (rebinding).
// Records are in zone-file syntax: "A 1.2.3.4", "AAAA ::1", "CNAME other.test.".
// No records means NXDOMAIN.
type Answer func(n int) []string

// Server is a running stub server.
type Server struct {
	Addr    string // host:port, UDP and TCP
	mu      sync.Mutex
	names   map[string]Answer
	zones   map[string]Answer // by zone: every name under it without an answer of its own
	servers []*dns.Server
	queries map[string]int // per name and type: "name/A"
	unnamed int            // queries without exactly one question
}

// Start serves on 127.0.0.1 (UDP and TCP, one port) until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// New serves on 127.0.0.1 (UDP and TCP, one port) until Close: for a program
// (bench) that has no testing.TB.
func New() (*Server, error) {
	s := &Server{names: map[string]Answer{}, zones: map[string]Answer{}, queries: map[string]int{}}
	pc, ln, err := listenBoth()
	if err != nil {
		return nil, err
	}
	s.Addr = pc.LocalAddr().String()
	s.servers = []*dns.Server{{PacketConn: pc, Handler: s}, {Listener: ln, Handler: s}}
	for _, srv := range s.servers {
		go srv.ActivateAndServe()
	}
	return s, nil
}

// Close stops the server.
func (s *Server) Close() {
	for _, srv := range s.servers {
		srv.Shutdown()
	}
}

// Set makes name answer with the fixed records.
func (s *Server) Set(name string, records ...string) {
	s.SetFunc(name, func(int) []string { return records })
}

// SetFunc makes name answer with whatever f returns for each query.
func (s *Server) SetFunc(name string, f Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[dns.Fqdn(strings.ToLower(name))] = f
}

// SetZone makes zone and every name under it that has no answer of its own (Set,
// SetFunc) answer with whatever f returns.
func (s *Server) SetZone(zone string, f Answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.zones[dns.Fqdn(strings.ToLower(zone))] = f
}

// Queries returns how many A and AAAA queries name has received.
func (s *Server) Queries(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	fqdn := dns.Fqdn(strings.ToLower(name))
	return s.queries[fqdn+"/A"] + s.queries[fqdn+"/AAAA"]
}

// Total returns how many queries of any name and type the server has received.
func (s *Server) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.unnamed
	for _, c := range s.queries {
		n += c
	}
	return n
}

// ServeDNS answers one query, following CNAME records the way a recursive resolver
// would put them in the answer section, with TTL 0 so nothing is cached.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 {
		s.mu.Lock()
		s.unnamed++
		s.mu.Unlock()
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	for hops := 0; hops < 8; hops++ {
		recs, ok := s.lookup(name, q.Qtype)
		if !ok {
			if hops == 0 {
				m.Rcode = dns.RcodeNameError
			}
			break
		}
		next := ""
		for _, r := range recs {
			rr, err := dns.NewRR(name + " 0 IN " + r)
			if err != nil {
				continue
			}
			if c, isCNAME := rr.(*dns.CNAME); isCNAME {
				next = c.Target
				m.Answer = append(m.Answer, rr)
			} else if rr.Header().Rrtype == q.Qtype {
				m.Answer = append(m.Answer, rr)
			}
		}
		if next == "" {
			break
		}
		name = next
	}
	w.WriteMsg(m)
}

func (s *Server) lookup(name string, qtype uint16) ([]string, bool) {
	s.mu.Lock()
	f, ok := s.names[name]
	if !ok {
		f, ok = s.zoneOf(name)
	}
	key := name + "/" + dns.TypeToString[qtype]
	n := s.queries[key]
	s.queries[key]++
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	recs := f(n) // the n-th query of this type: A and AAAA each count their own
	return recs, len(recs) > 0
}

// zoneOf returns the answer of the zone name is in (the closest), if any. s.mu is held.
func (s *Server) zoneOf(name string) (Answer, bool) {
	for zone := name; zone != ""; {
		if f, ok := s.zones[zone]; ok {
			return f, true
		}
		_, rest, found := strings.Cut(zone, ".")
		if !found {
			break
		}
		zone = rest
	}
	return nil, false
}

// listenBoth binds UDP on a free port and TCP on the same port, trying again when
// the TCP side of the port is taken.
func listenBoth() (net.PacketConn, net.Listener, error) {
	var err error
	for range 16 {
		var pc net.PacketConn
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return nil, nil, err
		}
		ln, lerr := net.Listen("tcp", pc.LocalAddr().String())
		if lerr == nil {
			return pc, ln, nil
		}
		pc.Close()
		err = lerr
	}
	return nil, nil, err
}
