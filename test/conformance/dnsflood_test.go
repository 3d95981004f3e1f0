package conformance_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/egressd/egressd/internal/testutil/procfs"
)

// The DNS TCP flood: attempts from dnsFloodSources loopback addresses, each
// connection sending one query and then holding the connection, far more than
// dns.max_tcp_connections (256) and dns.max_tcp_per_client (32) at their defaults.
const (
	dnsFloodSources   = 20
	dnsFloodPerSource = 100
	dnsTCPCap         = 256 // config.DefaultDNSMaxTCPConnections
)

// TestHookUnderDNSTCPFlood: while the sandbox holds (or tries to hold) thousands of
// TCP connections to the DNS guard, egressd keeps at most the cap of them (so its
// descriptors stay bounded), UDP queries are answered, a pre-tool hook call gets the
// endpoint's allow within its timeout, and RSS stays within 64 MiB of idle.
func TestHookUnderDNSTCPFlood(t *testing.T) {
	w := hooksWorld(t, config{dnsListen: "127.0.0.1:0"})
	guard := w.dnsAddr(t)
	k := w.begin(t)
	idleRSS, idleFDs := w.rss(t), w.fds(t)

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	refused := 0
	deadline := time.Now().Add(30 * time.Second)
	for s := range dnsFloodSources {
		for range dnsFloodPerSource {
			if time.Now().After(deadline) {
				break
			}
			c, ok := floodDNS(t, guard, fmt.Sprintf("127.0.1.%d", s+1))
			if ok {
				held = append(held, c)
			} else {
				refused++
			}
		}
	}
	peakRSS, peakFDs := w.rss(t), w.fds(t)
	took := k.hookCallAllowed()
	answerUDP(t, guard)

	if len(held) > dnsTCPCap {
		t.Errorf("the guard served and kept %d TCP connections, more than dns.max_tcp_connections %d", len(held), dnsTCPCap)
	}
	if extra := peakFDs - idleFDs; extra > dnsTCPCap+32 {
		t.Errorf("egressd holds %d more descriptors under the flood, want at most the cap %d (+32)", extra, dnsTCPCap)
	}
	if peakRSS-idleRSS > rssBound {
		t.Errorf("RSS %d MiB under the flood, %d MiB idle", peakRSS>>20, idleRSS>>20)
	}
	t.Logf("DNS TCP flood: %d attempts, %d held, %d closed at once; egressd fds idle %d, peak %d; RSS idle %d MiB, peak %d MiB; hook call %s",
		len(held)+refused, len(held), refused, idleFDs, peakFDs, idleRSS>>20, peakRSS>>20, took)
	for _, c := range held {
		c.Close()
	}
	held = nil
	if resp := k.get("http://allowed.test/after-dns-flood"); resp.StatusCode != 200 {
		t.Errorf("after the flood: %d", resp.StatusCode)
	}
}

// floodDNS connects to the guard from src and sends one query: ok when the guard
// answered it (the connection is then held open), false when it closed it at once.
func floodDNS(t *testing.T, guard, src string) (net.Conn, bool) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := d.Dial("tcp", guard)
	if err != nil {
		t.Fatalf("dial the DNS guard from %s: %v", src, err)
	}
	nc.(*net.TCPConn).SetLinger(0)
	c := &dns.Conn{Conn: nc}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if c.WriteMsg(m) == nil {
		if _, err := c.ReadMsg(); err == nil {
			return nc, true
		}
	}
	nc.Close()
	return nil, false
}

// answerUDP asks the guard over UDP and wants an answer.
func answerUDP(t *testing.T, guard string) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	resp, _, err := (&dns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(m, guard)
	if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
		t.Fatalf("UDP query during the flood: %v %v", resp, err)
	}
}

// dnsAddr waits for the DNS guard's "listening" line and returns its address.
func (w *world) dnsAddr(t *testing.T) string {
	t.Helper()
	for range 200 {
		for _, l := range w.logLines() {
			if l["message"] == "listening" && l["listener"] == "dns" {
				return l["address"].(string)
			}
		}
		sleepTick()
	}
	t.Fatal("the DNS guard never logged its address")
	return ""
}

// fds is egressd's open descriptor count now.
func (w *world) fds(t *testing.T) int {
	t.Helper()
	n, err := procfs.FDs(w.ServingPid())
	if err != nil {
		t.Fatal(err)
	}
	return n
}
