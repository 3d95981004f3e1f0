package dnsguard_test

import (
	"encoding/json"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/testutil/netns"
)

// The addresses a sinkholing guard listens on: a sinkhole answer names the
// address its query arrived on, and neither loopback nor an unknown address
// will do, so these scenarios run in a network namespace of their own
// (netns.Run) with these addresses on its lo.
const (
	sinkV4  = "10.53.0.1"
	sinkV4b = "10.53.0.2"
	sinkV6  = "fd00:53::1"
)

// sinkholeTTL is the TTL the guard gives a sinkhole answer.
const sinkholeTTL = 5

func TestSinkhole(t *testing.T) {
	netns.Run(t, func(t *testing.T) {
		for _, a := range []string{sinkV4 + "/32", sinkV4b + "/32", sinkV6 + "/128"} {
			netns.AddLoopbackAddr(t, a)
		}
		t.Run("IPv4 link", testSinkholeIPv4)
		t.Run("IPv6 link", testSinkholeIPv6)
		t.Run("refuse", testSinkholeOff)
		t.Run("loopback is refused", testSinkholeLoopback)
		t.Run("wildcard 0.0.0.0", func(t *testing.T) { testSinkholeWildcard(t, "0.0.0.0") })
		t.Run("wildcard ::", func(t *testing.T) { testSinkholeWildcard(t, "::") })
		t.Run("log line", testSinkholeLogged)
	})
}

// sinkholeWorld is a world whose guard listens on host and sinkholes.
func sinkholeWorld(t *testing.T, host string) *world {
	t.Helper()
	return newWorld(t, func(o *dnsguard.Options) {
		o.Listen, o.Sinkhole = net.JoinHostPort(host, "0"), true
	})
}

// wantSinkhole checks a sinkhole answer: NOERROR and exactly the records of
// want (none for the other family), each with the sinkhole's TTL.
func wantSinkhole(t *testing.T, m *dns.Msg, want ...string) {
	t.Helper()
	wantAddrs(t, m, want...)
	for _, rr := range m.Answer {
		if rr.Header().Ttl != sinkholeTTL {
			t.Errorf("TTL %d, want %d: %s", rr.Header().Ttl, sinkholeTTL, rr)
		}
	}
}

// testSinkholeIPv4: A for a name off the allowlist is the guard's own
// address, AAAA is empty, every other type is REFUSED, over UDP and TCP; the
// name is never forwarded, and the rest of the guard is as before.
func testSinkholeIPv4(t *testing.T) {
	w := sinkholeWorld(t, sinkV4)
	for _, network := range []string{"udp", "tcp"} {
		wantSinkhole(t, w.ask(t, network, "evil.test.", dns.TypeA), sinkV4)
		wantSinkhole(t, w.ask(t, network, "EVIL.test.", dns.TypeAAAA))
		wantSinkhole(t, w.ask(t, network, "secret-data.x1.evil.test.", dns.TypeA), sinkV4)
		for _, qtype := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeANY, dns.TypeHTTPS, dns.TypeSRV, dns.TypeCNAME} {
			wantRcode(t, w.ask(t, network, "evil.test.", qtype), dns.RcodeRefused)
		}
	}
	if n := w.upstream.Total(); n != 0 {
		t.Fatalf("the upstream saw %d queries for names off the allowlist", n)
	}
	// Names that are not names, and IP literals, are REFUSED, sinkhole or not.
	for _, name := range []string{"-a.github.test.", "a$b.evil.test.", "10.0.0.1.", "127.1."} {
		wantRcode(t, w.ask(t, "udp", name, dns.TypeA), dns.RcodeRefused)
	}
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
	// A reload that allows the name: the next query is looked up, and answered
	// with the real address.
	w.setPolicy(t, allowlist.Entry{Domain: "evil.test"})
	wantAddrs(t, w.ask(t, "udp", "evil.test.", dns.TypeA), "8.8.4.4")
}

// testSinkholeIPv6: on an IPv6 link AAAA is the address and A is empty.
func testSinkholeIPv6(t *testing.T) {
	w := sinkholeWorld(t, sinkV6)
	for _, network := range []string{"udp", "tcp"} {
		wantSinkhole(t, w.ask(t, network, "evil.test.", dns.TypeAAAA), sinkV6)
		wantSinkhole(t, w.ask(t, network, "evil.test.", dns.TypeA))
	}
	if n := w.upstream.Total(); n != 0 {
		t.Fatalf("the upstream saw %d queries", n)
	}
}

// testSinkholeOff: with Sinkhole false (dns.refused_names: refuse) a name off
// the allowlist is REFUSED on the same address.
func testSinkholeOff(t *testing.T) {
	w := newWorld(t, func(o *dnsguard.Options) { o.Listen = net.JoinHostPort(sinkV4, "0") })
	for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		wantRcode(t, w.ask(t, "udp", "evil.test.", qtype), dns.RcodeRefused)
	}
}

// testSinkholeLoopback: a query that arrived on loopback is REFUSED: the
// sandbox's connections to loopback are not redirected to egressd.
func testSinkholeLoopback(t *testing.T) {
	w := sinkholeWorld(t, "127.0.0.1")
	wantRcode(t, w.ask(t, "udp", "evil.test.", dns.TypeA), dns.RcodeRefused)
	wantRcode(t, w.ask(t, "tcp", "evil.test.", dns.TypeA), dns.RcodeRefused)
}

// testSinkholeWildcard: a guard on a wildcard address answers each query with
// the address that query was sent to, and replies from it: each client sends
// from another of the namespace's addresses, so the reply's source would
// otherwise be that one, and its UDP socket, connected to the address it
// asked, takes nothing else.
func testSinkholeWildcard(t *testing.T, wildcard string) {
	w := sinkholeWorld(t, wildcard)
	_, port, err := net.SplitHostPort(w.guard.Addr())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr, from string
		qtype      uint16
	}{{sinkV4, sinkV4b, dns.TypeA}, {sinkV4b, sinkV4, dns.TypeA}, {sinkV6, "::1", dns.TypeAAAA}} {
		for _, network := range []string{"udp", "tcp"} {
			m := new(dns.Msg)
			m.SetQuestion("evil.test.", c.qtype)
			resp := exchangeFrom(t, network, netip.MustParseAddr(c.from), net.JoinHostPort(c.addr, port), m)
			wantSinkhole(t, resp, c.addr)
		}
	}
	if n := w.upstream.Total(); n != 0 {
		t.Fatalf("the upstream saw %d queries", n)
	}
}

// testSinkholeLogged: the sinkhole's line keeps the name and the reason, at
// info, and says what was answered.
func testSinkholeLogged(t *testing.T) {
	w := sinkholeWorld(t, sinkV4)
	w.ask(t, "udp", "evil.test.", dns.TypeA)
	w.ask(t, "udp", "evil.test.", dns.TypeTXT)
	want := []map[string]any{
		{"level": "info", "message": "dns", "name": "evil.test.", "qtype": "A", "decision": "deny",
			"reason": "not_allowlisted", "rcode": "NOERROR", "answer": "sinkhole", "answers": 1.0},
		{"level": "info", "message": "dns", "name": "evil.test.", "qtype": "TXT", "decision": "deny",
			"reason": "qtype_refused", "rcode": "REFUSED", "answer": "none", "answers": 0.0},
	}
	lines := w.logs.Lines()
	if len(lines) != len(want) {
		t.Fatalf("%d log lines, want %d: %q", len(lines), len(want), lines)
	}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatal(err)
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v\n%s", i, k, got[k], v, line)
			}
		}
	}
}

// TestSinkholeNeedsAKnownAddress: a query whose arrival address is unknown
// (a wildcard socket whose kernel did not say), loopback or link-local is
// REFUSED, sinkhole or not: no answer the client could not use.
func TestSinkholeNeedsAKnownAddress(t *testing.T) {
	p, err := allowlist.Compile(baseEntries, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := dnsguard.New(dnsguard.Options{Policy: func() *allowlist.Policy { return p }, Sinkhole: true})
	for _, local := range []string{"0.0.0.0", "::", "127.0.0.1", "::1", "fe80::1", "169.254.1.1", sinkV4} {
		req := new(dns.Msg)
		req.SetQuestion("evil.test.", dns.TypeA)
		w := &recorder{local: netip.MustParseAddr(local)}
		s.ServeDNS(w, req)
		want := dns.RcodeRefused
		if local == sinkV4 {
			want = dns.RcodeSuccess
		}
		if w.msg.Rcode != want {
			t.Errorf("arrived on %s: rcode %s, want %s", local, dns.RcodeToString[w.msg.Rcode], dns.RcodeToString[want])
		}
	}
}
