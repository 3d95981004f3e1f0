package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/miekg/dns"
)

// Nothing here dials the addresses in the answers: resolving only talks to
// the stub on 127.0.0.1, so these tests run outside a namespace.

func TestLookup(t *testing.T) {
	s := newStubDNS(t)
	s.set("public.test",
		rr(t, "public.test. 60 IN AAAA 2606:4700::1111"),
		rr(t, "public.test. 60 IN A 8.8.8.8"),
		rr(t, "public.test. 60 IN A 1.1.1.1"),
		rr(t, "public.test. 60 IN AAAA ::ffff:8.8.8.8"), // the same address as the first A
	)
	s.set("mapped6.test", rr(t, "mapped6.test. 60 IN AAAA ::ffff:127.0.0.1"))
	r := NewResolver(s.addr, waitTimeout)

	got, err := r.Lookup(context.Background(), "public.test")
	if err != nil {
		t.Fatal(err)
	}
	want := addrs("8.8.8.8", "1.1.1.1", "2606:4700::1111")
	if len(got) != 3 || !got[0].Is4() || !got[1].Is4() || !sameSet(got, want) {
		t.Errorf("Lookup(public.test) = %v, want %v in any order within each family, IPv4 first", got, want)
	}

	got, err = r.Lookup(context.Background(), "mapped6.test")
	if err != nil || !slices.Equal(got, addrs("127.0.0.1")) {
		t.Errorf("Lookup(mapped6.test) = %v, %v; want [127.0.0.1] unmapped", got, err)
	}
}

func TestLookupErrors(t *testing.T) {
	s := newStubDNS(t)
	s.set("empty.test") // NOERROR, no records
	s.set("slow.test", noReply)
	r := NewResolver(s.addr, 300*time.Millisecond)

	for _, host := range []string{"nx.test", "empty.test", "slow.test"} {
		start := time.Now()
		_, err := r.Lookup(context.Background(), host)
		var de *DNSError
		var blocked *BlockedError
		if !errors.As(err, &de) || de.Host != host || errors.As(err, &blocked) {
			t.Errorf("Lookup(%s) = %v, want a *DNSError and no *BlockedError", host, err)
		}
		if elapsed := time.Since(start); elapsed > 2*time.Second {
			t.Errorf("Lookup(%s) took %v with a 300ms timeout", host, elapsed)
		}
	}
	_, err := r.Lookup(context.Background(), "nx.test")
	var ne *net.DNSError
	if !errors.As(err, &ne) || !ne.IsNotFound {
		t.Errorf("Lookup(nx.test) = %v, want NXDOMAIN through Unwrap", err)
	}
	_, err = r.Lookup(context.Background(), "slow.test")
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.IsTimeout) {
		t.Errorf("Lookup(slow.test) = %v, want a timeout", err)
	}
}

func TestLookupTCPFallback(t *testing.T) {
	s := newStubDNS(t)
	s.set("big.test", truncateUDP, rr(t, "big.test. 60 IN A 8.8.4.4"))
	got, err := NewResolver(s.addr, waitTimeout).Lookup(context.Background(), "big.test")
	if err != nil || !slices.Equal(got, addrs("8.8.4.4")) {
		t.Fatalf("Lookup(big.test) = %v, %v; want [8.8.4.4]", got, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tcp == 0 {
		t.Error("truncated UDP answer was not retried over TCP")
	}
}

func TestResolve(t *testing.T) {
	s := newStubDNS(t)
	s.set("public.test", rr(t, "public.test. 60 IN A 8.8.8.8"), rr(t, "public.test. 60 IN AAAA 2606:4700::1111"))
	s.set("loop.test", rr(t, "loop.test. 60 IN A 127.0.0.1"))
	s.set("meta.test", rr(t, "meta.test. 60 IN A 169.254.169.254"))
	s.set("meta6.test", rr(t, "meta6.test. 60 IN AAAA fd00:ec2::254"))
	s.set("mixed.test", rr(t, "mixed.test. 60 IN A 8.8.8.8"), rr(t, "mixed.test. 60 IN A 10.0.0.1"))
	s.set("mixed6.test", rr(t, "mixed6.test. 60 IN A 8.8.8.8"), rr(t, "mixed6.test. 60 IN AAAA fd00::1"))
	s.set("chain.test",
		rr(t, "chain.test. 60 IN CNAME mid.test."),
		rr(t, "mid.test. 60 IN CNAME internal.test."),
		rr(t, "internal.test. 60 IN A 10.0.0.7"))
	s.set("mapped6.test", rr(t, "mapped6.test. 60 IN AAAA ::ffff:127.0.0.1"))
	s.set("nat64.test", rr(t, "nat64.test. 60 IN AAAA 64:ff9b::a9fe:a9fe"))
	r := NewResolver(s.addr, waitTimeout)
	g := mustGuard(t, Options{})

	for host, want := range map[string]Class{
		"public.test": Public, "loop.test": Loopback, "meta.test": Metadata, "meta6.test": Metadata,
		"mixed.test": Private, "mixed6.test": Private, "chain.test": Private, "mapped6.test": Loopback,
		"nat64.test": Metadata,
	} {
		got, err := g.Resolve(context.Background(), r, host, netip.Addr{}, 443)
		var blocked *BlockedError
		switch {
		case want == Public && (err != nil || len(got) != 2 || got[0] != netip.MustParseAddrPort("8.8.8.8:443")):
			t.Errorf("Resolve(%s) = %v, %v; want [8.8.8.8:443 [2606:4700::1111]:443]", host, got, err)
		case want != Public && (!errors.As(err, &blocked) || blocked.Class != want || got != nil):
			t.Errorf("Resolve(%s) = %v, %v; want refused as %q", host, got, err, want)
		}
	}

	_, err := g.Resolve(context.Background(), r, "nx.test", netip.Addr{}, 443)
	var de *DNSError
	if !errors.As(err, &de) {
		t.Errorf("Resolve(nx.test) = %v, want a *DNSError", err)
	}

	open := mustGuard(t, Options{AllowCIDRs: prefixes("10.0.0.0/8")})
	got, err := open.Resolve(context.Background(), r, "mixed.test", netip.Addr{}, 443)
	if err != nil || len(got) != 2 {
		t.Errorf("Resolve(mixed.test) with 10/8 open = %v, %v; want both answers", got, err)
	}
}

func TestResolveLiteral(t *testing.T) {
	s := newStubDNS(t)
	r := NewResolver(s.addr, waitTimeout)
	g := mustGuard(t, Options{})
	for lit, want := range map[string]string{"8.8.8.8": "8.8.8.8:443", "::ffff:8.8.8.8": "8.8.8.8:443", "2606:4700::1111": "[2606:4700::1111]:443"} {
		got, err := g.Resolve(context.Background(), r, lit, netip.MustParseAddr(lit), 443)
		if err != nil || len(got) != 1 || got[0].String() != want {
			t.Errorf("Resolve(%s) = %v, %v; want [%s]", lit, got, err, want)
		}
	}
	for _, lit := range []string{"10.0.0.1", "169.254.169.254", "::ffff:127.0.0.1"} {
		var blocked *BlockedError
		if _, err := g.Resolve(context.Background(), r, lit, netip.MustParseAddr(lit), 443); !errors.As(err, &blocked) {
			t.Errorf("Resolve(%s) = %v, want a *BlockedError", lit, err)
		}
	}
	if n := s.total(); n != 0 {
		t.Errorf("literals caused %d DNS queries, want 0", n)
	}
}

// TestResolveRebinding: a name that answers public first and loopback next is
// refused on the second lookup.
func TestResolveRebinding(t *testing.T) {
	s := newStubDNS(t)
	s.setFunc("rebind.test", func(n int) []dns.RR {
		if n == 1 {
			return []dns.RR{rr(t, "rebind.test. 0 IN A 8.8.8.8")}
		}
		return []dns.RR{rr(t, "rebind.test. 0 IN A 127.0.0.1")}
	})
	r := NewResolver(s.addr, waitTimeout)
	g := mustGuard(t, Options{})

	got, err := g.Resolve(context.Background(), r, "rebind.test", netip.Addr{}, 443)
	if err != nil || len(got) != 1 || got[0] != netip.MustParseAddrPort("8.8.8.8:443") {
		t.Fatalf("first Resolve(rebind.test) = %v, %v; want [8.8.8.8:443]", got, err)
	}
	_, err = g.Resolve(context.Background(), r, "rebind.test", netip.Addr{}, 443)
	var blocked *BlockedError
	if !errors.As(err, &blocked) || blocked.Class != Loopback {
		t.Fatalf("second Resolve(rebind.test) = %v, want refused as loopback", err)
	}
	if n := s.count("rebind.test. A"); n != 2 {
		t.Errorf("rebind.test A queried %d times, want 2 (no caching)", n)
	}
}

// TestSystemResolver runs in a namespace: the system resolver may send a
// query to the configured nameserver, which is not on this machine.
func TestSystemResolver(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		got, err := NewResolver("", waitTimeout).Lookup(context.Background(), "localhost")
		if err != nil || !(slices.Contains(got, netip.MustParseAddr("127.0.0.1")) || slices.Contains(got, netip.IPv6Loopback())) {
			t.Fatalf("system Lookup(localhost) = %v, %v; want a loopback address", got, err)
		}
	})
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func sameSet(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}
