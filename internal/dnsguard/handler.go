package dnsguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/netguard"
)

// reason is why a query was not answered with addresses; "" when it was.
// The values appear as the "reason" field of the query's log line.
type reason string

const (
	reasonNone           reason = ""
	reasonRateLimited    reason = "rate_limited"   // the client's token bucket is empty
	reasonMalformed      reason = "malformed"      // unparseable, or not exactly one question
	reasonQClass         reason = "qclass_refused" // not class IN
	reasonQType          reason = "qtype_refused"  // not A or AAAA
	reasonBadName        reason = "bad_name"       // NormalizeHost (allowlist.ValidateName) rejects the name
	reasonIPLiteral      reason = "ip_literal"     // the name is an IP address spelling
	reasonNoPolicy       reason = "no_policy"      // Options.Policy gave nothing
	reasonNotAllowlisted        = reason(allowlist.ReasonNotAllowlisted)
	reasonDNSFailure            = reason(allowlist.ReasonDNSFailure) // upstream failed or timed out
)

// answer is what a response's answer section holds: the "answer" field of
// the query's log line.
type answer string

const (
	answerNone     answer = "none"     // a refusal: nothing looked up, nothing answered
	answerResolver answer = "resolver" // the resolver's addresses (perhaps none)
	answerSinkhole answer = "sinkhole" // egressd's own address (none for the other family)
)

// query is one query's state, from decision to log line.
type query struct {
	client  netip.Addr
	local   netip.Addr // the address the query arrived on (sinkhole.go)
	proto   string     // "udp" or "tcp"
	name    string     // as asked
	qtype   uint16
	reason  reason
	answer  answer
	rule    string // the matching allowlist entry's pattern
	omitted int    // internal addresses left out of the answer
	start   time.Time
}

// ServeDNS answers one query (dns.Handler). Run serves it on Listen; tests
// and fuzzers may call it directly.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := &query{client: addrOf(w.RemoteAddr()), local: localAddr(w), proto: protoOf(w.LocalAddr()),
		answer: answerNone, start: time.Now()}
	resp := s.answer(q, req)
	if q.proto == "udp" {
		resp.Truncate(udpSize(req))
	}
	s.logQuery(q, resp) // before the write: a client that has its answer finds the line logged
	w.WriteMsg(resp)
}

// answer decides on req and builds the response. Checks run cheapest
// first, and nothing is sent upstream before the name has matched.
func (s *Server) answer(q *query, req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(maxUDPSize, false)
	}
	if len(req.Question) == 1 {
		q.name, q.qtype = req.Question[0].Name, req.Question[0].Qtype
	}
	if q.reason = s.check(q, req); q.reason != reasonNone {
		s.refuse(q, resp)
		return resp
	}
	s.resolve(q, resp)
	return resp
}

// refuse answers a query that check refused: with the sinkhole for a name
// off the allowlist when Options.Sinkhole says so, else with the refusal's
// rcode.
func (s *Server) refuse(q *query, resp *dns.Msg) {
	if q.reason == reasonNotAllowlisted && s.o.Sinkhole && s.sinkhole(q, resp) {
		return
	}
	resp.Rcode = rcodeFor(q.reason)
}

// check returns why req is refused before any lookup, or reasonNone.
func (s *Server) check(q *query, req *dns.Msg) reason {
	switch {
	case !s.limiter.allow(q.client, q.start):
		return reasonRateLimited
	case req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Response:
		return reasonMalformed
	case req.Question[0].Qclass != dns.ClassINET:
		return reasonQClass
	case q.qtype != dns.TypeA && q.qtype != dns.TypeAAAA:
		return reasonQType
	}
	host, addr, err := allowlist.NormalizeHost(q.name)
	switch {
	case err != nil:
		return reasonBadName
	case addr.IsValid():
		return reasonIPLiteral
	}
	return s.match(q, host)
}

// match decides whether an allowlist entry matches host. Ports do not
// apply to DNS: Decide with port 0 reports port_not_allowed for a name that
// matches, and sets the winning rule either way.
func (s *Server) match(q *query, host string) reason {
	var p *allowlist.Policy
	if s.o.Policy != nil {
		p = s.o.Policy()
	}
	if p == nil {
		return reasonNoPolicy
	}
	d := p.Decide(allowlist.Target{Host: host})
	if d.Rule == nil {
		return reasonNotAllowlisted
	}
	q.rule = d.Rule.Pattern
	return reasonNone
}

// resolve looks the matched name up and fills resp with the addresses of
// the asked family that are not internal.
func (s *Server) resolve(q *query, resp *dns.Msg) {
	ctx, cancel := context.WithTimeout(s.baseContext(), s.o.Timeout)
	defer cancel()
	host, _, _ := allowlist.NormalizeHost(q.name) // checked in check
	// The rooted name keeps the resolver from trying search domains.
	ips, err := s.resolver().Lookup(ctx, host+".")
	q.answer = answerResolver
	if err != nil {
		resp.Rcode = lookupRcode(err)
		if resp.Rcode != dns.RcodeSuccess {
			q.reason = reasonDNSFailure
		}
		return
	}
	for _, ip := range ips {
		if ip.Is4() != (q.qtype == dns.TypeA) {
			continue
		}
		if s.internal(ip) {
			q.omitted++
			continue
		}
		resp.Answer = append(resp.Answer, record(q, ip, answerTTL))
	}
}

// lookupRcode maps a failed lookup to an rcode: NXDOMAIN when the upstream
// said the name does not exist (Go's resolver says so for a name with
// neither A nor AAAA records too), SERVFAIL for failures and timeouts, and
// NOERROR (no answers) for a lookup that succeeded without addresses.
func lookupRcode(err error) int {
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return dns.RcodeNameError
	case errors.As(err, &dnsErr), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return dns.RcodeServerFailure
	}
	return dns.RcodeSuccess
}

// internal reports whether the sandbox must not be shown ip.
func (s *Server) internal(ip netip.Addr) bool {
	if g := s.guard(); g != nil {
		return g.Check(netip.AddrPortFrom(ip, 0)) != nil
	}
	return netguard.Classify(ip) != netguard.Public
}

// record is the A or AAAA record for ip, named as the client asked (the
// case of the question echoed, as 0x20-randomising resolvers expect).
func record(q *query, ip netip.Addr, ttl uint32) dns.RR {
	hdr := dns.RR_Header{Name: q.name, Rrtype: q.qtype, Class: dns.ClassINET, Ttl: ttl}
	if ip.Is4() {
		return &dns.A{Hdr: hdr, A: ip.AsSlice()}
	}
	return &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()}
}

// rcodeFor is the response code of a refusal.
func rcodeFor(r reason) int {
	if r == reasonMalformed {
		return dns.RcodeFormatError
	}
	return dns.RcodeRefused
}

// udpSize is the largest UDP response the client accepts: its EDNS0 buffer
// size (at least 512, at most maxUDPSize), or 512 without EDNS0.
func udpSize(req *dns.Msg) int {
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(size, min(int(opt.UDPSize()), maxUDPSize))
	}
	return size
}

func (s *Server) baseContext() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.base
}

// logQuery writes the query's line: what was asked, by whom, and what the guard
// decided. A refusal, sinkhole included, is logged at info, so an operator sees why a
// sandbox's name did not resolve to its host; the rest at debug, and so are
// rate-limited refusals, which a flood would otherwise turn into a flood of lines.
func (s *Server) logQuery(q *query, resp *dns.Msg) {
	decision, ev := "allow", s.o.Log.Debug()
	if q.reason != reasonNone {
		decision = "deny"
		if q.reason == reasonDNSFailure {
			decision = "fail"
		}
		if q.reason != reasonRateLimited {
			ev = s.o.Log.Info()
		}
	}
	ev.Str("client", q.client.String()).Str("proto", q.proto).
		Str("name", q.name).Str("qtype", dns.Type(q.qtype).String()).
		Str("decision", decision).Str("reason", string(q.reason)).Str("rule", q.rule).
		Str("rcode", dns.RcodeToString[resp.Rcode]).Str("answer", string(q.answer)).Int("answers", len(resp.Answer)).
		Int("omitted", q.omitted).Int64("dur_ms", time.Since(q.start).Milliseconds()).Msg("dns")
}

// addrOf is the IP address of a (unmapped), or the zero Addr; for a
// *session (dst.go) the client's.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *session:
		return a.src.Addr().Unmap()
	}
	return netip.Addr{}
}

// localAddr is the address a query arrived on: the local address of its TCP
// connection or UDP socket, or, on a wildcard UDP socket, the datagram's
// destination as the kernel reported it (dst.go). The zero Addr or an
// unspecified one when it is not known.
func localAddr(w dns.ResponseWriter) netip.Addr {
	if s, ok := w.RemoteAddr().(*session); ok {
		return s.dst
	}
	return addrOf(w.LocalAddr())
}

func protoOf(a net.Addr) string {
	if _, ok := a.(*net.TCPAddr); ok {
		return "tcp"
	}
	return "udp"
}

// resolver and guard are the current ones: Options.Current's when set.
func (s *Server) resolver() *netguard.Resolver {
	if s.o.Current != nil {
		if r, _ := s.o.Current(); r != nil {
			return r
		}
	}
	return s.o.Resolver
}

func (s *Server) guard() *netguard.Guard {
	if s.o.Current != nil {
		if _, g := s.o.Current(); g != nil {
			return g
		}
	}
	return s.o.Guard
}
