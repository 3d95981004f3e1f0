package dnsguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/dnsguard"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/testutil/dnsstub"
	"github.com/egressd/egressd/internal/testutil/syncbuf"
)

// world is a DNS guard on 127.0.0.1 in front of a dnsstub upstream, with a
// policy the test can swap. Every scenario talks to it over real UDP and
// TCP sockets. The stub answers with public addresses (8.8.4.4,
// 2606:4700:4700::1111) that nothing ever connects to.
type world struct {
	guard    *dnsguard.Server
	upstream *dnsstub.Server
	policy   atomic.Pointer[allowlist.Policy]
	logs     *syncBuffer
}

// baseEntries is the allowlist of most scenarios.
var baseEntries = []allowlist.Entry{
	{Domain: "api.example.com"},
	{Domain: "*.github.test"},
	{Domain: "pypi.org", Ports: []uint16{443}},
	{Domain: "mixed.example.com"},
	{Domain: "internal.example.com"},
	{Domain: "many.example.com"},
	{Domain: "missing.example.com"},
}

// newWorld starts the stub and the guard; tweak adjusts the options.
func newWorld(t *testing.T, tweak func(*dnsguard.Options)) *world {
	t.Helper()
	w := &world{upstream: dnsstub.Start(t), logs: &syncBuffer{}}
	w.setPolicy(t, baseEntries...)
	w.upstream.Set("api.example.com", "A 8.8.4.4", "AAAA 2606:4700:4700::1111")
	w.upstream.Set("a.b.github.test", "A 8.8.4.4")
	w.upstream.Set("github.test", "A 8.8.4.4")
	w.upstream.Set("pypi.org", "A 8.8.4.4")
	w.upstream.Set("evil.test", "A 8.8.4.4")
	w.upstream.Set("mixed.example.com", "A 10.0.0.5", "A 8.8.4.4", "A 127.0.0.1", "A 169.254.169.254",
		"AAAA fd00::1", "AAAA ::1", "AAAA 2606:4700:4700::1111")
	w.upstream.Set("internal.example.com", "A 10.0.0.5", "AAAA fd00::1")
	o := dnsguard.Options{
		Listen:   "127.0.0.1:0",
		Policy:   w.policy.Load,
		Resolver: netguard.NewResolver(w.upstream.Addr, 2*time.Second),
		Log:      zerolog.New(w.logs).Level(zerolog.DebugLevel),
		Timeout:  2 * time.Second,
	}
	if tweak != nil {
		tweak(&o)
	}
	w.guard = dnsguard.New(o)
	if err := w.guard.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.guard.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w
}

func (w *world) setPolicy(t *testing.T, entries ...allowlist.Entry) {
	t.Helper()
	p, err := allowlist.Compile(entries, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.policy.Store(p)
}

// ask sends one query of qtype for name over net ("udp" or "tcp").
func (w *world) ask(t *testing.T, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return w.exchange(t, network, m)
}

func (w *world) exchange(t *testing.T, network string, m *dns.Msg) *dns.Msg {
	t.Helper()
	return exchangeAt(t, network, w.guard.Addr(), m)
}

// exchangeAt sends m to addr over network and returns the reply. Over UDP
// the client's socket is connected, so it takes a reply only from addr.
func exchangeAt(t *testing.T, network, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	return exchangeFrom(t, network, netip.Addr{}, addr, m)
}

// exchangeFrom is exchangeAt from the local address from (any when zero).
func exchangeFrom(t *testing.T, network string, from netip.Addr, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second, Dialer: &net.Dialer{Timeout: 3 * time.Second}}
	if from.IsValid() && network == "tcp" {
		c.Dialer.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))
	} else if from.IsValid() {
		c.Dialer.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0))
	}
	var resp *dns.Msg
	var err error
	if network == "tcp" {
		resp, err = exchangeTCP(c, m, addr)
	} else {
		resp, _, err = c.Exchange(m, addr)
	}
	if err != nil {
		t.Fatalf("%s query %v to %s: %v", network, m.Question, addr, err)
	}
	return resp
}

// exchangeTCP is c.Exchange over a TCP connection that is reset, not
// closed, at the end. A closed client socket would sit in TIME_WAIT on its
// ephemeral port for a minute, and a later listener that picks that port
// for UDP and then wants it for TCP (dnsstub.Start) would fail to bind.
func exchangeTCP(c *dns.Client, m *dns.Msg, addr string) (*dns.Msg, error) {
	d := c.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: c.Timeout}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	nc.(*net.TCPConn).SetLinger(0)
	resp, _, err := c.ExchangeWithConn(m, &dns.Conn{Conn: nc})
	return resp, err
}

// addrs returns the A and AAAA answers, and fails on any other record.
func addrs(t *testing.T, m *dns.Msg) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, rr := range m.Answer {
		if rr.Header().Ttl > 60 {
			t.Errorf("TTL %d > 60: %s", rr.Header().Ttl, rr)
		}
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, netip.MustParseAddr(rr.A.String()))
		case *dns.AAAA:
			out = append(out, netip.MustParseAddr(rr.AAAA.String()))
		default:
			t.Errorf("unexpected answer %s", rr)
		}
	}
	return out
}

func wantRcode(t *testing.T, m *dns.Msg, want int) {
	t.Helper()
	if m.Rcode != want {
		t.Fatalf("rcode %s, want %s\n%s", dns.RcodeToString[m.Rcode], dns.RcodeToString[want], m)
	}
}

func wantAddrs(t *testing.T, m *dns.Msg, want ...string) {
	t.Helper()
	wantRcode(t, m, dns.RcodeSuccess)
	got := addrs(t, m)
	if len(got) != len(want) {
		t.Fatalf("answers %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != netip.MustParseAddr(want[i]) {
			t.Fatalf("answers %v, want %v", got, want)
		}
	}
}

func TestAllowedNameAnswered(t *testing.T) {
	w := newWorld(t, nil)
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			wantAddrs(t, w.ask(t, network, "api.example.com.", dns.TypeA), "8.8.4.4")
			wantAddrs(t, w.ask(t, network, "api.example.com.", dns.TypeAAAA), "2606:4700:4700::1111")
		})
	}
}

// TestNameNormalised shows that the guard matches the normalised name and
// echoes the question as asked (0x20 case randomisation survives).
func TestNameNormalised(t *testing.T) {
	w := newWorld(t, nil)
	resp := w.ask(t, "udp", "API.Example.COM.", dns.TypeA)
	wantAddrs(t, resp, "8.8.4.4")
	if got := resp.Answer[0].Header().Name; got != "API.Example.COM." {
		t.Fatalf("answer name %q, want the question's spelling", got)
	}
}

func TestWildcard(t *testing.T) {
	w := newWorld(t, nil)
	wantAddrs(t, w.ask(t, "udp", "a.b.github.test.", dns.TypeA), "8.8.4.4")
	// *.github.test does not match github.test itself, nor badgithub.test.
	for _, name := range []string{"github.test.", "badgithub.test."} {
		wantRcode(t, w.ask(t, "udp", name, dns.TypeA), dns.RcodeRefused)
		if n := w.upstream.Queries(name); n != 0 {
			t.Errorf("%s was forwarded %d times", name, n)
		}
	}
}

// TestPortsDoNotApply shows that an entry restricted to port 443 still
// makes its name resolvable.
func TestPortsDoNotApply(t *testing.T) {
	w := newWorld(t, nil)
	wantAddrs(t, w.ask(t, "udp", "pypi.org.", dns.TypeA), "8.8.4.4")
}

func TestNotAllowlistedRefusedAndNeverForwarded(t *testing.T) {
	w := newWorld(t, nil)
	for _, network := range []string{"udp", "tcp"} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
			wantRcode(t, w.ask(t, network, "evil.test.", qtype), dns.RcodeRefused)
		}
	}
	if n := w.upstream.Queries("evil.test"); n != 0 {
		t.Fatalf("evil.test was forwarded %d times", n)
	}
}

func TestOtherTypesRefused(t *testing.T) {
	w := newWorld(t, nil)
	for _, qtype := range []uint16{dns.TypeTXT, dns.TypeMX, dns.TypeANY, dns.TypeCNAME, dns.TypeNS,
		dns.TypeSOA, dns.TypeSRV, dns.TypePTR, dns.TypeHTTPS, dns.TypeAXFR, dns.TypeIXFR} {
		for _, network := range []string{"udp", "tcp"} {
			resp := w.ask(t, network, "api.example.com.", qtype)
			wantRcode(t, resp, dns.RcodeRefused)
			if len(resp.Answer) != 0 {
				t.Errorf("%s %s: answers %v", network, dns.TypeToString[qtype], resp.Answer)
			}
		}
	}
	if n := w.upstream.Queries("api.example.com"); n != 0 {
		t.Fatalf("refused types caused %d upstream queries", n)
	}
}

func TestOtherClassRefused(t *testing.T) {
	w := newWorld(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("api.example.com.", dns.TypeA)
	m.Question[0].Qclass = dns.ClassCHAOS
	wantRcode(t, w.exchange(t, "udp", m), dns.RcodeRefused)
}

// TestExfiltrationShapedNamesRefused sends the shape of a DNS tunnel: data
// encoded in long labels under a domain the attacker's server answers.
func TestExfiltrationShapedNamesRefused(t *testing.T) {
	w := newWorld(t, nil)
	label := strings.Repeat("a", 63)
	names := []string{
		label + "." + label + "." + label + ".evil.test.",
		"dGhlIHNlY3JldCB0b2tlbiBpcyBodW50ZXIy.x1.evil.test.",
		"api.example.com.evil.test.",
		"evil.test.api.example.com.", // a subdomain of an exact entry is not allowed
	}
	for _, name := range names {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT} {
			wantRcode(t, w.ask(t, "udp", name, qtype), dns.RcodeRefused)
		}
		if n := w.upstream.Queries(name); n != 0 {
			t.Errorf("%s forwarded %d times", name, n)
		}
	}
}

func TestIPLiteralAndBadNamesRefused(t *testing.T) {
	w := newWorld(t, nil)
	w.setPolicy(t, allowlist.Entry{Domain: "*"}) // even "*" does not make these names
	for _, name := range []string{"10.0.0.1.", "127.1.", "0x7f.0.0.1.", "2130706433.", ".", "a\\.b.example.com.", "*.example.com."} {
		wantRcode(t, w.ask(t, "udp", name, dns.TypeA), dns.RcodeRefused)
	}
}

// TestStarAnswersEveryName documents that a "*" entry makes every name
// resolvable (through the resolver), and every other type still refused.
func TestStarAnswersEveryName(t *testing.T) {
	w := newWorld(t, nil)
	w.setPolicy(t, allowlist.Entry{Domain: "*"})
	wantAddrs(t, w.ask(t, "udp", "evil.test.", dns.TypeA), "8.8.4.4")
	wantRcode(t, w.ask(t, "udp", "evil.test.", dns.TypeTXT), dns.RcodeRefused)
}

func TestInternalAnswersOmitted(t *testing.T) {
	w := newWorld(t, nil)
	wantAddrs(t, w.ask(t, "udp", "mixed.example.com.", dns.TypeA), "8.8.4.4")
	wantAddrs(t, w.ask(t, "udp", "mixed.example.com.", dns.TypeAAAA), "2606:4700:4700::1111")
	// Only internal addresses: the name exists, the sandbox gets none.
	wantAddrs(t, w.ask(t, "udp", "internal.example.com.", dns.TypeA))
	wantAddrs(t, w.ask(t, "udp", "internal.example.com.", dns.TypeAAAA))
}

// TestGuardOpensAllowCIDRs shows that with a Guard, network.allow_cidrs
// decides which private answers the sandbox sees; loopback and metadata
// stay hidden whatever it says.
func TestGuardOpensAllowCIDRs(t *testing.T) {
	g, err := netguard.New(netguard.Options{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, func(o *dnsguard.Options) { o.Guard = g })
	wantAddrs(t, w.ask(t, "udp", "mixed.example.com.", dns.TypeA), "10.0.0.5", "8.8.4.4")
	wantAddrs(t, w.ask(t, "udp", "mixed.example.com.", dns.TypeAAAA), "2606:4700:4700::1111")
}

func TestUpstreamFailures(t *testing.T) {
	w := newWorld(t, nil)
	// An allowlisted name the upstream does not know.
	wantRcode(t, w.ask(t, "udp", "missing.example.com.", dns.TypeA), dns.RcodeNameError)

	// An upstream that is not there: a closed port on loopback.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close()
	w2 := newWorld(t, func(o *dnsguard.Options) { o.Resolver = netguard.NewResolver(dead, time.Second) })
	wantRcode(t, w2.ask(t, "udp", "api.example.com.", dns.TypeA), dns.RcodeServerFailure)
}

// TestRateLimit drains one client's bucket: queries beyond Burst are
// REFUSED without reaching the upstream, and the bucket refills at
// RatePerSecond.
func TestRateLimit(t *testing.T) {
	w := newWorld(t, func(o *dnsguard.Options) { o.RatePerSecond, o.Burst = 2, 3 })
	for i := range 3 {
		if resp := w.ask(t, "udp", "api.example.com.", dns.TypeA); resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d within the burst: %s", i, dns.RcodeToString[resp.Rcode])
		}
	}
	before := w.upstream.Queries("api.example.com")
	wantRcode(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), dns.RcodeRefused)
	wantRcode(t, w.ask(t, "tcp", "api.example.com.", dns.TypeA), dns.RcodeRefused)
	if after := w.upstream.Queries("api.example.com"); after != before {
		t.Fatalf("rate-limited queries reached the upstream (%d -> %d)", before, after)
	}
	time.Sleep(600 * time.Millisecond) // 2/s: at least one token back
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
}

// TestPolicyReload shows that Options.Policy is consulted on every query.
func TestPolicyReload(t *testing.T) {
	w := newWorld(t, nil)
	wantRcode(t, w.ask(t, "udp", "evil.test.", dns.TypeA), dns.RcodeRefused)
	w.setPolicy(t, allowlist.Entry{Domain: "evil.test"})
	wantAddrs(t, w.ask(t, "udp", "evil.test.", dns.TypeA), "8.8.4.4")
	w.setPolicy(t, baseEntries...)
	wantRcode(t, w.ask(t, "udp", "evil.test.", dns.TypeA), dns.RcodeRefused)
}

func TestNilPolicyRefusesAll(t *testing.T) {
	w := newWorld(t, func(o *dnsguard.Options) { o.Policy = func() *allowlist.Policy { return nil } })
	wantRcode(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), dns.RcodeRefused)
}

// TestTruncation shows a UDP answer cut to the client's size with TC set,
// and the whole answer over TCP.
func TestTruncation(t *testing.T) {
	w := newWorld(t, nil)
	var recs []string
	// 36 records: the stub, which never truncates, still fits them in the
	// resolver's 1232-byte UDP buffer; the guard's compressed answer does
	// not fit in 512 bytes.
	for i := range 36 {
		recs = append(recs, "A 8.8."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1))
	}
	w.upstream.Set("many.example.com", recs...)
	q := new(dns.Msg)
	q.SetQuestion("many.example.com.", dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	udp, size := rawExchangeSize(t, w.guard.Addr(), b)
	if !udp.Truncated || size > dns.MinMsgSize {
		t.Fatalf("UDP answer: truncated %t, %d bytes; want TC within 512 bytes", udp.Truncated, size)
	}
	if tcp := w.ask(t, "tcp", "many.example.com.", dns.TypeA); tcp.Truncated || len(tcp.Answer) != 36 {
		t.Fatalf("TCP answer: truncated %t, %d answers; want all 36", tcp.Truncated, len(tcp.Answer))
	}
}

// TestMalformedPackets sends junk: the server answers FORMERR where a
// header can be read, NOTIMP for other opcodes, and keeps serving.
func TestMalformedPackets(t *testing.T) {
	w := newWorld(t, nil)
	conn, err := net.Dial("udp", w.guard.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		junk := make([]byte, rng.IntN(600))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		if len(junk) > 2 {
			junk[2] &^= 0x80 // a query, not a response, so it is not ignored outright
		}
		conn.Write(junk)
	}
	// The junk may have filled the socket's receive buffer, and a UDP query
	// arriving then is dropped: wait until the server has worked through it.
	w.waitServing(t)
	// Two questions; and a header promising a question that is not there.
	two := new(dns.Msg)
	two.SetQuestion("api.example.com.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	wantRcode(t, w.exchange(t, "udp", two), dns.RcodeFormatError)
	short := []byte{0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 3, 'a', 'p'}
	if resp := rawExchange(t, w.guard.Addr(), short); resp.Rcode != dns.RcodeFormatError || resp.Id != 0x1234 {
		t.Fatalf("truncated question: %s", resp)
	}
	notify := new(dns.Msg)
	notify.SetNotify("api.example.com.")
	wantRcode(t, w.exchange(t, "udp", notify), dns.RcodeNotImplemented)
	// Still serving, over both transports.
	wantAddrs(t, w.ask(t, "udp", "api.example.com.", dns.TypeA), "8.8.4.4")
	wantAddrs(t, w.ask(t, "tcp", "api.example.com.", dns.TypeA), "8.8.4.4")
}

// TestEveryQueryLogged checks the query's line: name, type and decision.
func TestEveryQueryLogged(t *testing.T) {
	w := newWorld(t, nil)
	w.ask(t, "udp", "api.example.com.", dns.TypeA)
	w.ask(t, "tcp", "evil.test.", dns.TypeAAAA)
	w.ask(t, "udp", "api.example.com.", dns.TypeTXT)
	want := []map[string]any{
		{"name": "api.example.com.", "qtype": "A", "decision": "allow", "reason": "", "rule": "api.example.com", "rcode": "NOERROR", "answer": "resolver", "proto": "udp", "client": "127.0.0.1"},
		{"name": "evil.test.", "qtype": "AAAA", "decision": "deny", "reason": "not_allowlisted", "rcode": "REFUSED", "answer": "none", "proto": "tcp"},
		{"name": "api.example.com.", "qtype": "TXT", "decision": "deny", "reason": "qtype_refused", "rcode": "REFUSED", "answer": "none"},
	}
	lines := w.logs.Lines()
	if len(lines) != len(want) {
		t.Fatalf("%d log lines, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatal(err)
		}
		level := "info" // refusals at info, the rest at debug
		if got["decision"] == "allow" {
			level = "debug"
		}
		if got["level"] != level || got["message"] != "dns" {
			t.Errorf("line %d: level %v message %v, want %s dns", i, got["level"], got["message"], level)
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v\n%s", i, k, got[k], v, line)
			}
		}
	}
}

func TestListenErrors(t *testing.T) {
	if err := dnsguard.New(dnsguard.Options{Listen: "nonsense"}).Run(context.Background()); err == nil {
		t.Fatal("Run with a bad address succeeded")
	}
	w := newWorld(t, nil)
	taken := dnsguard.New(dnsguard.Options{Listen: w.guard.Addr()})
	if err := taken.Listen(); err == nil {
		t.Fatal("Listen on a taken port succeeded")
	}
}

// waitServing retries a good query until it is answered (3s at most).
func (w *world) waitServing(t *testing.T) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("api.example.com.", dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: 100 * time.Millisecond}
	for deadline := time.Now().Add(3 * time.Second); ; {
		if _, _, err := c.Exchange(m, w.guard.Addr()); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("server not answering after junk: %v", err)
		}
	}
}

// rawExchange sends b over UDP and parses the reply.
func rawExchange(t *testing.T, addr string, b []byte) *dns.Msg {
	t.Helper()
	m, _ := rawExchangeSize(t, addr, b)
	return m
}

// rawExchangeSize is rawExchange that also returns the reply's size.
func rawExchangeSize(t *testing.T, addr string, b []byte) (*dns.Msg, int) {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	return m, n
}

type syncBuffer = syncbuf.Buffer

// TestRefusalsLoggedAtInfo: at the default level an operator sees why a sandbox's
// name did not resolve; an allowed query stays at debug.
func TestRefusalsLoggedAtInfo(t *testing.T) {
	w := newWorld(t, func(o *dnsguard.Options) { o.Log = o.Log.Level(zerolog.InfoLevel) })
	w.ask(t, "udp", "evil.test.", dns.TypeA)
	w.ask(t, "udp", "api.example.com.", dns.TypeTXT)
	w.ask(t, "udp", "api.example.com.", dns.TypeA)
	var lines []map[string]any
	for deadline := time.Now().Add(2 * time.Second); len(lines) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		lines = nil
		for _, l := range bytes.Split(w.logs.Bytes(), []byte("\n")) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil && m["message"] == "dns" {
				lines = append(lines, m)
			}
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d dns lines at info, want the 2 refusals: %v", len(lines), lines)
	}
	for i, want := range []struct{ name, reason string }{{"evil.test.", "not_allowlisted"}, {"api.example.com.", "qtype_refused"}} {
		if lines[i]["level"] != "info" || lines[i]["decision"] != "deny" || lines[i]["name"] != want.name || lines[i]["reason"] != want.reason {
			t.Errorf("line %d = %v, want an info deny of %s (%s)", i, lines[i], want.name, want.reason)
		}
	}
}
