// Package dnsguard answers the sandbox's DNS: A/AAAA for names the allowlist
// could allow; for every other name egressd's own address or REFUSED, and
// never a lookup.
//
// In transparent mode the sandbox's port 53 is redirected here
// (docs/transparent.md). A DNS server that forwards whatever it is asked is a
// channel out of the sandbox: "<secret>.attacker.example" reaches the
// attacker's name server without a single TCP connection. The guard closes
// it by deciding before it resolves:
//
//   - Only QUERY with one IN question of type A or AAAA is answered; every
//     other type (TXT, MX, ANY, AXFR, ...) and class is REFUSED.
//   - The name is normalised (allowlist.NormalizeHost) and must be matched by
//     an allowlist entry; ports do not apply to DNS, so a name whose entry
//     lists other ports still matches. IP-literal names ("10.0.0.1.") and
//     names NormalizeHost rejects are REFUSED.
//   - A name no entry matches is answered with egressd's own address on the
//     link the query arrived on (Options.Sinkhole, sinkhole.go), so the
//     client connects to egressd and reads the refusal and its reason; or,
//     where that address cannot serve or without Sinkhole, REFUSED.
//   - A name that did not match is never sent upstream. Only matched names
//     are looked up, through netguard.Resolver (so network.resolver applies).
//   - Answers are filtered: only A records for A, only AAAA for AAAA, and no
//     address the address guard would refuse (internal addresses are useless
//     to the sandbox, whose connections egressd dials itself, and naming them
//     would show it the internal network). A name left with no address is
//     answered NOERROR with an empty answer section.
//   - Each client IP has a token bucket; a query over it is REFUSED.
//   - TCP connections are capped in total and per client IP (a connection
//     over a cap is closed as soon as it is accepted), closed after an idle
//     time between queries and after a number of queries, so that held
//     connections cannot take the file descriptors and memory the proxy
//     shares (tcpcap.go).
//   - Malformed messages get FORMERR (miekg/dns answers those before the
//     handler runs); nothing a client sends makes the server panic.
//
// A "*" allowlist entry matches every name, so with one the guard answers
// every A and AAAA query through the resolver: names can then carry data to
// any name server, as they can through any connection "*" allows. The guard
// still refuses every other query type.
//
// The guard's answers are a convenience, not a boundary: the sandbox's
// connections are redirected to egressd whatever address it connects to,
// and egressd resolves and checks the SNI or Host itself.
package dnsguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/sockets"
)

// Defaults for the zero values of Options.
const (
	// DefaultRatePerSecond is each client IP's sustained query rate. A
	// package install resolves a few dozen names (A and AAAA each), so 50
	// per second never slows an honest sandbox and still bounds what a
	// flood costs the upstream resolver.
	DefaultRatePerSecond = 50
	// DefaultBurst is each client IP's bucket size.
	DefaultBurst = 100
	// DefaultTimeout bounds one query's upstream lookup (limits.dns).
	DefaultTimeout = 5 * time.Second
)

// Server limits that are not options.
const (
	// answerTTL is the TTL of every answer. netguard.Resolver does not
	// report upstream TTLs, so one short TTL is used for all: well under
	// the 60 s cap, so a reload or an upstream change reaches the sandbox
	// quickly, and cheap, because egressd re-resolves on every connect
	// anyway.
	answerTTL = 30
	// maxUDPSize is the largest UDP response, whatever the client's EDNS0
	// buffer size: 1232 bytes avoids IP fragmentation (DNS flag day 2020).
	maxUDPSize = 1232
	// tcpReadTimeout bounds a TCP client's first query and every write to
	// it; Options.TCPIdle the wait for each later query.
	tcpReadTimeout = 2 * time.Second
)

// Options configures a Server.
type Options struct {
	// Listen is the ip:port served over UDP and TCP (dns.listen). Port 0
	// picks a free port, the same for both (tests); Addr reports it. On a
	// wildcard address (0.0.0.0, ::) the guard asks the kernel which address
	// each UDP query was sent to, for the sinkhole and the reply (dst.go).
	Listen string
	// PacketConn and Listener, when both are set, are the sockets to serve,
	// already bound (inherited from egressd's supervising parent); Listen is
	// then only their address.
	PacketConn net.PacketConn
	Listener   net.Listener
	// Policy returns the current allowlist; it is called for every query,
	// so a reload applies to the next one. Nil, or a nil result, refuses
	// every query.
	Policy func() *allowlist.Policy
	// Resolver looks up matched names (network.resolver). Nil means the
	// system resolver.
	Resolver *netguard.Resolver
	// Guard, when set, decides which answers are internal: those it would
	// refuse to dial are omitted, so network.allow_cidrs applies. Nil omits
	// every address that netguard.Classify does not call public.
	Guard *netguard.Guard
	// Current, when set, returns the resolver and guard to use for each query,
	// overriding Resolver and Guard, so a reload of network.resolver or
	// network.allow_cidrs applies to the next query as the policy does.
	Current func() (*netguard.Resolver, *netguard.Guard)
	// Sinkhole answers A and AAAA queries for names the allowlist cannot
	// allow with the address the query arrived on, egressd's own on the
	// sandbox's link (sinkhole.go), instead of REFUSED. The daemon sets it
	// from dns.refused_names, whose default is sinkhole; false (the zero
	// value) is refuse.
	Sinkhole bool
	// Log receives one line per query (refusals at info, the rest at
	// debug); the zero Logger discards them.
	Log zerolog.Logger
	// RatePerSecond and Burst size each client IP's token bucket; zero or
	// less means DefaultRatePerSecond and DefaultBurst. Queries over the
	// rate are answered REFUSED (not dropped, so a client gives up at once
	// instead of retrying into the limit).
	RatePerSecond float64
	Burst         int
	// Timeout bounds one query's upstream lookup; zero or less means
	// DefaultTimeout.
	Timeout time.Duration
	// The TCP bounds (dns.max_tcp_connections, dns.max_tcp_per_client,
	// dns.tcp_idle, dns.tcp_max_queries): a connection beyond
	// MaxTCPConnections open at once, or beyond MaxTCPPerClient from one
	// client IP, is closed as soon as it is accepted; one with no query for
	// TCPIdle, or that has carried TCPMaxQueries, is closed. Zero or less
	// means the config package's defaults.
	MaxTCPConnections int
	MaxTCPPerClient   int
	TCPIdle           time.Duration
	TCPMaxQueries     int
}

// Server is the DNS guard. Its lifecycle is New, then Run (which calls
// Listen if the caller has not); a Server runs once.
type Server struct {
	o       Options
	limiter *limiter
	base    context.Context // Run's context: cancels lookups in flight on shutdown

	mu  sync.Mutex
	pc  net.PacketConn
	ln  net.Listener
	ran bool
}

// New returns a Server for o with the defaults applied. It does not bind
// anything: Listen or Run does.
func New(o Options) *Server {
	if o.RatePerSecond <= 0 {
		o.RatePerSecond = DefaultRatePerSecond
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Resolver == nil {
		o.Resolver = netguard.NewResolver("", o.Timeout)
	}
	o.MaxTCPConnections = orDefault(o.MaxTCPConnections, config.DefaultDNSMaxTCPConnections)
	o.MaxTCPPerClient = orDefault(o.MaxTCPPerClient, config.DefaultDNSMaxTCPPerClient)
	o.TCPIdle = orDefault(o.TCPIdle, config.DefaultDNSTCPIdle)
	o.TCPMaxQueries = orDefault(o.TCPMaxQueries, config.DefaultDNSTCPMaxQueries)
	return &Server{o: o, limiter: newLimiter(o.RatePerSecond, o.Burst), base: context.Background()}
}

// orDefault is v, or def when v is zero or less.
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Listen binds the UDP socket and the TCP listener on Options.Listen, or takes
// Options.PacketConn and Options.Listener. Calling it again does nothing.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pc != nil {
		return nil
	}
	pc, ln := s.o.PacketConn, s.o.Listener
	if pc == nil || ln == nil {
		addr, err := netip.ParseAddrPort(s.o.Listen)
		if err != nil {
			return fmt.Errorf("dnsguard: listen %q: %w", s.o.Listen, err)
		}
		if pc, ln, err = sockets.ListenPair(addr); err != nil {
			return fmt.Errorf("dnsguard: %w", err)
		}
	}
	s.pc = withDst(pc)
	s.ln = newCapListener(ln, s.o.MaxTCPConnections, s.o.MaxTCPPerClient, s.logTCPCap)
	return nil
}

// Addr is the bound ip:port (UDP and TCP), or "" before Listen.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pc == nil {
		return ""
	}
	return s.pc.LocalAddr().String()
}

// Run listens (unless Listen was called) and serves UDP and TCP until ctx
// is done, then shuts down, letting queries in flight finish for up to a
// second. It returns nil after ctx is done, or the error that stopped it.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("dnsguard: Run called twice")
	}
	s.ran, s.base = true, ctx
	servers := []*dns.Server{s.dnsServer(s.pc, nil), s.dnsServer(nil, s.ln)}
	s.mu.Unlock()
	return serve(ctx, servers)
}

// dnsServer configures one miekg/dns server on pc or ln.
func (s *Server) dnsServer(pc net.PacketConn, ln net.Listener) *dns.Server {
	return &dns.Server{
		PacketConn:     pc,
		Listener:       ln,
		Handler:        s,
		ReadTimeout:    tcpReadTimeout,
		WriteTimeout:   tcpReadTimeout,
		IdleTimeout:    func() time.Duration { return s.o.TCPIdle },
		MaxTCPQueries:  s.o.TCPMaxQueries,
		MsgAcceptFunc:  acceptQuery,
		MsgInvalidFunc: s.logInvalid,
	}
}

// serve runs the servers until ctx is done or one fails, then shuts all
// down. It waits for each to start first: miekg/dns cannot shut down a
// server that has not started.
func serve(ctx context.Context, servers []*dns.Server) error {
	errs := make(chan error, len(servers))
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { errs <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-errs:
			shutdown(servers)
			return fmt.Errorf("dnsguard: %w", err)
		}
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		err = fmt.Errorf("dnsguard: %w", err)
	}
	shutdown(servers)
	return err
}

// shutdown stops the servers that started, waiting up to a second.
func shutdown(servers []*dns.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, srv := range servers {
		srv.ShutdownContext(ctx) // "server not started" for one that failed: nothing to do
		if srv.PacketConn != nil {
			srv.PacketConn.Close()
		}
		if srv.Listener != nil {
			srv.Listener.Close()
		}
	}
}

// acceptQuery is miekg/dns's default accept function restricted to
// QUERY: NOTIFY (which the default lets through) gets NOTIMP too.
func acceptQuery(h dns.Header) dns.MsgAcceptAction {
	if opcode := int(h.Bits>>11) & 0xF; opcode != dns.OpcodeQuery && h.Bits&(1<<15) == 0 {
		return dns.MsgRejectNotImplemented
	}
	return dns.DefaultMsgAcceptFunc(h)
}

// logTCPCap logs a TCP connection closed on accept by a cap.
func (s *Server) logTCPCap(client netip.Addr) {
	s.o.Log.Debug().Str("client", client.String()).Str("proto", "tcp").Str("decision", "deny").
		Str("reason", string(reasonTCPCap)).Int("max_tcp_connections", s.o.MaxTCPConnections).
		Int("max_tcp_per_client", s.o.MaxTCPPerClient).Msg("dns")
}

// logInvalid logs a message miekg/dns could not parse (it answers FORMERR
// where it can read a header, and nothing otherwise).
func (s *Server) logInvalid(m []byte, err error) {
	s.o.Log.Debug().Int("bytes", len(m)).Str("decision", "deny").Str("reason", string(reasonMalformed)).
		AnErr("error", err).Msg("dns")
}
