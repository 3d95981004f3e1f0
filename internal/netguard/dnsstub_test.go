package netguard

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// stubDNS is an authoritative DNS server on 127.0.0.1, UDP and TCP on one
// port, for names the test defines. Unknown names get NXDOMAIN.
type stubDNS struct {
	addr string

	mu      sync.Mutex
	zone    map[string]answerFunc
	queries map[string]int // by "name type", e.g. "a.test. A"
	tcp     int            // queries over TCP
}

// answerFunc returns the records for the n-th query (from 1) of its name and
// type; the server keeps the records of the asked type and every CNAME.
type answerFunc func(n int) []dns.RR

// Special answers.
var (
	truncateUDP = &dns.TXT{Hdr: dns.RR_Header{Name: "truncate-udp."}} // TC on UDP, answer on TCP
	noReply     = &dns.TXT{Hdr: dns.RR_Header{Name: "no-reply."}}     // never answer
)

func newStubDNS(t *testing.T) *stubDNS {
	t.Helper()
	s := &stubDNS{zone: map[string]answerFunc{}, queries: map[string]int{}}
	pc, ln := listenUDPAndTCP(t)
	s.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: s}, {Listener: ln, Handler: s}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return s
}

// listenUDPAndTCP opens UDP and TCP on the same 127.0.0.1 port.
func listenUDPAndTCP(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("no free port for UDP and TCP")
	return nil, nil
}

// set defines name with fixed records.
func (s *stubDNS) set(name string, rrs ...dns.RR) {
	s.setFunc(name, func(int) []dns.RR { return rrs })
}

func (s *stubDNS) setFunc(name string, f answerFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.zone[dns.Fqdn(name)] = f
}

func (s *stubDNS) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[key]
}

func (s *stubDNS) total() (n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.queries {
		n += c
	}
	return n
}

func (s *stubDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	overTCP := w.RemoteAddr().Network() == "tcp"
	s.mu.Lock()
	key := q.Name + " " + dns.TypeToString[q.Qtype]
	s.queries[key]++
	if overTCP {
		s.tcp++
	}
	f, ok := s.zone[strings.ToLower(q.Name)]
	n := s.queries[key]
	s.mu.Unlock()

	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if !ok {
		m.Rcode = dns.RcodeNameError
		_ = w.WriteMsg(m)
		return
	}
	for _, rr := range f(n) {
		switch {
		case rr == noReply:
			return
		case rr == truncateUDP && !overTCP:
			m.Truncated = true
			m.Answer = nil
			_ = w.WriteMsg(m)
			return
		case rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME:
			m.Answer = append(m.Answer, rr)
		}
	}
	_ = w.WriteMsg(m)
}

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatalf("dns.NewRR(%q): %v", s, err)
	}
	return r
}

// waitTimeout is how long a lookup test waits for a stub answer.
const waitTimeout = 5 * time.Second
