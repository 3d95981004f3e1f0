// Package origdst reads a redirected connection's original destination
// (SO_ORIGINAL_DST).
//
// When iptables or nftables NAT rewrites a TCP connection's destination
// (REDIRECT in OUTPUT, DNAT or REDIRECT in PREROUTING), the socket egressd
// accepts is addressed to egressd's transparent listener; conntrack still
// holds the destination the client asked for, and the getsockopt options
// SO_ORIGINAL_DST (IPv4) and IP6T_SO_ORIGINAL_DST (IPv6) return it. This is
// how Envoy's original_dst listener filter and Istio find the destination.
//
// Get asks conntrack, so its answer is only as good as the rules: a
// connection conntrack tracked but did not translate yields its own local
// address (the kernel returns the tuple as it saw it), and one it did not
// track at all is an error. Callers must therefore treat the result as the
// address the client chose, never as a checked destination: egressd takes
// only the port from it and decides on the SNI or Host.
//
// Linux only: other systems have no SO_ORIGINAL_DST.
package origdst

import "errors"

// ErrNotTCP is returned for a connection that does not expose a TCP socket
// (net.Conn wrappers such as *tls.Conn, pipes, UDP).
var ErrNotTCP = errors.New("origdst: not a TCP socket connection")

// ErrUnsupported is returned on systems without SO_ORIGINAL_DST (all but
// Linux).
var ErrUnsupported = errors.New("origdst: SO_ORIGINAL_DST is available only on Linux")
