package dnsguard

import (
	"net"
	"net/netip"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// dstConn is the UDP socket of a guard listening on a wildcard address
// (0.0.0.0, ::). Such a socket does not say which of the host's addresses a
// datagram was sent to, and a sinkhole answer names that address; dstConn
// asks the kernel for it with every datagram (IP_PKTINFO, IPV6_PKTINFO) and
// sends the reply from it, since a client accepts a reply only from the
// address it asked.
//
// miekg/dns serves a net.PacketConn that is not a *net.UDPConn through
// ReadFrom and WriteTo: the address ReadFrom returns (a *session) is what
// the handler sees as ResponseWriter.RemoteAddr and what WriteTo is given
// back for the reply.
type dstConn struct{ *net.UDPConn }

// session is the client a datagram came from and the address it was sent
// to (the zero Addr when the kernel did not say).
type session struct {
	src netip.AddrPort
	dst netip.Addr
}

func (s *session) Network() string { return "udp" }
func (s *session) String() string  { return s.src.String() }

// oobSize fits either family's destination control message.
var oobSize = max(len(ipv4.NewControlMessage(ipv4.FlagDst|ipv4.FlagInterface)),
	len(ipv6.NewControlMessage(ipv6.FlagDst|ipv6.FlagInterface)))

// withDst returns pc as a dstConn when it is bound to a wildcard address and
// the kernel takes the options that report destinations; otherwise pc
// itself, whose queries then arrive on an address the guard does not know.
func withDst(pc net.PacketConn) net.PacketConn {
	u, ok := pc.(*net.UDPConn)
	if !ok || !u.LocalAddr().(*net.UDPAddr).AddrPort().Addr().IsUnspecified() {
		return pc
	}
	// Go binds 0.0.0.0 as a dual-stack IPv6 socket where it can, so set both
	// families' options (as miekg/dns does for its own sockets) and give up
	// only when neither takes.
	err6 := ipv6.NewPacketConn(u).SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true)
	err4 := ipv4.NewPacketConn(u).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true)
	if err6 != nil && err4 != nil {
		return pc
	}
	return dstConn{u}
}

// ReadFrom reads one datagram and returns a *session as its address.
func (c dstConn) ReadFrom(b []byte) (int, net.Addr, error) {
	oob := make([]byte, oobSize)
	n, oobn, _, src, err := c.ReadMsgUDPAddrPort(b, oob)
	if err != nil {
		return n, nil, err
	}
	return n, &session{src: src, dst: parseDst(oob[:oobn])}, nil
}

// WriteTo sends b to a *session's client from the address its query was sent to.
func (c dstConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	s, ok := addr.(*session)
	if !ok {
		return c.UDPConn.WriteTo(b, addr)
	}
	n, _, err := c.WriteMsgUDPAddrPort(b, srcOOB(s.dst), s.src)
	return n, err
}

// parseDst reads the destination address from oob: IPV6_PKTINFO first (a
// dual-stack socket reports IPv4 datagrams there too, IPv4-mapped), then
// IP_PKTINFO.
func parseDst(oob []byte) netip.Addr {
	var cm6 ipv6.ControlMessage
	if cm6.Parse(oob) == nil && cm6.Dst != nil {
		if a, ok := netip.AddrFromSlice(cm6.Dst); ok {
			return a.Unmap()
		}
	}
	var cm4 ipv4.ControlMessage
	if cm4.Parse(oob) == nil && cm4.Dst != nil {
		if a, ok := netip.AddrFromSlice(cm4.Dst); ok {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// srcOOB is the control message that sends a datagram from src, or nil to
// let the kernel choose. IPv4 takes IP_PKTINFO even on a dual-stack socket;
// IPV6_PKTINFO would ignore an IPv4 address.
func srcOOB(src netip.Addr) []byte {
	switch {
	case !src.IsValid():
		return nil
	case src.Is4():
		return (&ipv4.ControlMessage{Src: src.AsSlice()}).Marshal()
	default:
		return (&ipv6.ControlMessage{Src: src.AsSlice()}).Marshal()
	}
}
