package main

import (
	"github.com/egressd/egressd/internal/testutil/dnsstub"
)

// benchZone is the DNS zone the stub answers: every name in it (the intercepted
// paths' hosts) is 127.0.0.1. egressd decides interception per allowlist entry,
// so each intercepted path needs a host of its own, and only localhost resolves
// without DNS (/etc/hosts).
const benchZone = "bench.test"

// startDNS starts the resolver egressd is pointed at (network.resolver): a
// dnsstub server on 127.0.0.1, UDP and TCP on one port, that answers A queries
// for benchZone with 127.0.0.1, AAAA queries there with no records, and every
// other name with NXDOMAIN. It never forwards a query, so no DNS traffic leaves
// the machine. egressd still reads /etc/hosts first, so localhost does not reach
// it. A name the transparent path pins (Set) answers with its own address.
func startDNS() (*dnsstub.Server, error) {
	s, err := dnsstub.New()
	if err != nil {
		return nil, err
	}
	s.SetZone(benchZone, func(int) []string { return []string{"A 127.0.0.1"} })
	return s, nil
}
