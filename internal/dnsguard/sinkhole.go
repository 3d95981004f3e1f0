package dnsguard

import (
	"net/netip"

	"github.com/miekg/dns"
)

// sinkholeTTL is the TTL of a sinkhole answer. Short, so that a name the
// allowlist gains by a reload soon resolves to its real addresses in the
// sandbox's caches; a client still holding the sinkhole address reaches
// egressd anyway, which decides on the SNI or Host and dials the real host.
const sinkholeTTL = 5

// sinkhole answers a query for a name the allowlist cannot allow with
// egressd's own address on the link the query arrived on. The client then
// connects to that address, where the sandbox's traffic to ports 80 and 443
// is redirected to egressd's transparent listener like any other, and reads
// the 403 and its reason, where REFUSED would show it only "could not
// resolve host". The name goes nowhere. A query of the other family gets
// NOERROR with no answer, as for a name without such records.
//
// It returns false, leaving the query to be REFUSED, when that address is
// not known or would not lead to egressd (sinkholeAddr).
func (s *Server) sinkhole(q *query, resp *dns.Msg) bool {
	self, ok := sinkholeAddr(q.local)
	if !ok {
		return false
	}
	q.answer = answerSinkhole
	if self.Is4() == (q.qtype == dns.TypeA) {
		resp.Answer = append(resp.Answer, record(q, self, sinkholeTTL))
	}
	return true
}

// sinkholeAddr is the address a sinkhole answer names: the one the query
// arrived on. It is not ok when that address is unknown (a wildcard socket
// whose kernel did not report it), loopback (the sandbox's connections to
// loopback are not redirected, as under the Kubernetes sidecar's rules, so
// the client would reach whatever listens there on its side instead of the
// refusal), or link-local (useless without its zone).
func sinkholeAddr(local netip.Addr) (netip.Addr, bool) {
	a := local.Unmap()
	return a, a.IsValid() && !a.IsUnspecified() && !a.IsLoopback() && !a.IsLinkLocalUnicast()
}
