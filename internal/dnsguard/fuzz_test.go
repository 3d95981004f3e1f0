package dnsguard_test

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/netguard"
)

// FuzzServeDNS feeds raw message bytes to the handler (the seed corpus is
// in testdata/fuzz/FuzzServeDNS), sinkholing on fuzzLocal. Bytes that do not
// parse are miekg/dns's to answer (FORMERR) and never reach the handler. For
// every message that parses, the handler must write exactly one response
// that packs, carries the request's ID, answers only A/AAAA records of the
// asked type, and for a name the allowlist does not match only the sinkhole
// (an A record of fuzzLocal), and sends nothing upstream for such a name.
func FuzzServeDNS(f *testing.F) {
	up := startCountingUpstream(f)
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "api.example.com"}, {Domain: "*.github.test"}}, allowlist.Options{})
	if err != nil {
		f.Fatal(err)
	}
	s := dnsguard.New(dnsguard.Options{
		Policy:        func() *allowlist.Policy { return p },
		Resolver:      netguard.NewResolver(up.addr, time.Second),
		RatePerSecond: 1e9, Burst: 1 << 30, // the limiter is not under test here
		Timeout:  time.Second,
		Sinkhole: true,
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		req := new(dns.Msg)
		if req.Unpack(data) != nil {
			return
		}
		before := up.total.Load()
		w := &recorder{local: fuzzLocal}
		s.ServeDNS(w, req)
		checkResponse(t, p, req, w)
		if !resolvable(p, req) && up.total.Load() != before {
			t.Fatalf("a refused query reached the upstream: %v", req.Question)
		}
	})
}

// resolvable reports whether the guard may look req up: one IN question of
// type A or AAAA for a name (not an IP literal) the policy matches.
func resolvable(p *allowlist.Policy, req *dns.Msg) bool {
	if req.Opcode != dns.OpcodeQuery || req.Response || len(req.Question) != 1 {
		return false
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET || (q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA) {
		return false
	}
	host, addr, err := allowlist.NormalizeHost(q.Name)
	return err == nil && !addr.IsValid() && p.Decide(allowlist.Target{Host: host}).Rule != nil
}

func checkResponse(t *testing.T, p *allowlist.Policy, req *dns.Msg, w *recorder) {
	t.Helper()
	if w.writes != 1 {
		t.Fatalf("%d responses written, want 1", w.writes)
	}
	resp := w.msg
	if _, err := resp.Pack(); err != nil {
		t.Fatalf("response does not pack: %v\n%s", err, resp)
	}
	if resp.Id != req.Id || !resp.Response {
		t.Fatalf("response id %d (request %d), QR %t", resp.Id, req.Id, resp.Response)
	}
	if len(resp.Answer) == 0 {
		return
	}
	if resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("answers with rcode %s:\n%s", dns.RcodeToString[resp.Rcode], resp)
	}
	for _, rr := range resp.Answer {
		if h := rr.Header(); h.Rrtype != req.Question[0].Qtype || h.Name != req.Question[0].Name || h.Ttl > 60 {
			t.Fatalf("answer %s does not match question %v", rr, req.Question[0])
		}
		if a, ok := rr.(*dns.A); !resolvable(p, req) && (!ok || len(resp.Answer) != 1 || !a.A.Equal(fuzzLocal.AsSlice())) {
			t.Fatalf("a name off the allowlist answered with more than the sinkhole %s:\n%s", fuzzLocal, resp)
		}
	}
}

// fuzzLocal is the address the fuzzer's queries arrive on: an address a
// sinkhole may name.
var fuzzLocal = netip.MustParseAddr("10.53.0.1")

// countingUpstream answers every query NXDOMAIN and counts them.
type countingUpstream struct {
	addr  string
	total atomic.Int64
}

func startCountingUpstream(tb testing.TB) *countingUpstream {
	tb.Helper()
	u := &countingUpstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.total.Add(1)
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		w.WriteMsg(m)
	})}
	var started sync.WaitGroup
	started.Add(1)
	srv.NotifyStartedFunc = started.Done
	go srv.ActivateAndServe()
	started.Wait()
	tb.Cleanup(func() { srv.Shutdown() })
	return u
}

// recorder is a dns.ResponseWriter that keeps what the handler writes, as
// a UDP client on 127.0.0.1 would see it, asking local (default 127.0.0.1).
type recorder struct {
	local  netip.Addr
	msg    *dns.Msg
	writes int
}

func (r *recorder) LocalAddr() net.Addr {
	if !r.local.IsValid() {
		return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(r.local, 53))
}
func (r *recorder) RemoteAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (r *recorder) WriteMsg(m *dns.Msg) error { r.msg = m; r.writes++; return nil }
func (r *recorder) Write(b []byte) (int, error) {
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		return 0, err
	}
	return len(b), r.WriteMsg(m)
}
func (r *recorder) Close() error        { return nil }
func (r *recorder) TsigStatus() error   { return nil }
func (r *recorder) TsigTimersOnly(bool) {}
func (r *recorder) Hijack()             {}
