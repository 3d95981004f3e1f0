package conformance_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// Fixed ports for the self-loop worlds: the namespace is the suite's own, so
// nothing else holds them, and the policy must name them before egressd binds.
const (
	selfListenerPort = "15001"
	selfAdminPort    = "15000"
	wildListenerPort = "15011"
	wildAdminPort    = "15010"
	// freeLoopbackPort is a loopback port nothing listens on: the control case.
	freeLoopbackPort = "15002"
)

// TestProxySelfLoop: with loopback opened (network.unsafe_allow_cidrs, the
// development switch) and a "*" entry for egressd's own ports, a request or tunnel
// to egressd's own listener or admin address is still refused: internal_address,
// detail self, however the address is spelt or resolved. A loopback port that is
// not egressd's is reachable in the same world, which shows that the refusal is the
// self check and not the loopback class.
func TestProxySelfLoop(t *testing.T) {
	w := newWorld(t, config{
		allowlist: []egressdtest.Entry{{Domain: "*", Ports: ports(selfListenerPort, selfAdminPort, freeLoopbackPort)}},
		unsafe:    []string{"127.0.0.0/8"},
		listener:  "127.0.0.1:" + selfListenerPort,
		admin:     "127.0.0.1:" + selfAdminPort,
	})
	cases := []struct{ name, authority, detail string }{
		{"own listener", "127.0.0.1:" + selfListenerPort, "self"},
		{"own admin listener", "127.0.0.1:" + selfAdminPort, "self"},
		{"own listener, short form", "127.1:" + selfListenerPort, "self"},
		{"own listener, decimal", "2130706433:" + selfListenerPort, "self"},
		{"own admin listener, hex", "0x7f000001:" + selfAdminPort, "self"},
		{"own listener, v4-mapped", "[::ffff:127.0.0.1]:" + selfListenerPort, "self"},
		{"own listener, NAT64", "[64:ff9b::7f00:1]:" + selfListenerPort, "self"},
		{"own listener through DNS", "self.test:" + selfListenerPort, "self"},
		{"own admin listener through DNS", "self.test:" + selfAdminPort, "self"},
		{"own listener, unspecified address", "0.0.0.0:" + selfListenerPort, "self"},
		{"own listener, IPv6 loopback (not opened)", "[::1]:" + selfListenerPort, "loopback"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := w.begin(t)
			k.refused(k.raw("GET http://"+tc.authority+"/healthz HTTP/1.1\r\nHost: "+tc.authority+"\r\n\r\n"),
				403, "internal_address", tc.detail)
			k.refused(k.raw("CONNECT "+tc.authority+" HTTP/1.1\r\nHost: "+tc.authority+"\r\n\r\n"),
				403, "internal_address", tc.detail)
		})
	}
	t.Run("control: another loopback port is reachable", func(t *testing.T) {
		k := w.begin(t)
		a := "127.0.0.1:" + freeLoopbackPort
		k.refused(k.raw("GET http://"+a+"/ HTTP/1.1\r\nHost: "+a+"\r\n\r\n"), 502, "upstream_unreachable", "")
	})
}

// TestProxySelfLoopWildcard: a listener on the unspecified address is reached
// through every local address (the stand-in public address on lo included), so
// each of them on its port is egressd itself.
func TestProxySelfLoopWildcard(t *testing.T) {
	w := newWorld(t, config{
		allowlist: []egressdtest.Entry{{Domain: "*", Ports: ports(wildListenerPort, wildAdminPort)}},
		unsafe:    []string{"127.0.0.0/8"},
		listener:  "0.0.0.0:" + wildListenerPort,
		admin:     "127.0.0.1:" + wildAdminPort,
	})
	w.ProxyAddr = net.JoinHostPort("127.0.0.1", wildListenerPort)
	for _, a := range []string{"127.0.0.1", "127.0.0.2", "0.0.0.0", publicIP, "[::ffff:127.0.0.9]", "self.test"} {
		t.Run(a, func(t *testing.T) {
			k := w.begin(t)
			authority := a + ":" + wildListenerPort
			k.refused(k.raw("GET http://"+authority+"/ HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"), 403, "internal_address", "self")
			k.refused(k.raw("CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"), 403, "internal_address", "self")
		})
	}
}

// ports converts port numbers written as strings.
func ports(ss ...string) []int {
	out := make([]int, len(ss))
	for i, s := range ss {
		n, err := strconv.Atoi(s)
		if err != nil {
			panic(err)
		}
		out[i] = n
	}
	return out
}
