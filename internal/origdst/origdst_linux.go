//go:build linux

package origdst

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Both options are 80. SO_ORIGINAL_DST is at level SOL_IP
// (linux/netfilter_ipv4.h) and fills a sockaddr_in; IP6T_SO_ORIGINAL_DST is
// at level SOL_IPV6 (linux/netfilter_ipv6/ip6_tables.h) and fills a
// sockaddr_in6.
const (
	soOriginalDst     = unix.SO_ORIGINAL_DST
	ip6tSoOriginalDst = 80
)

// Get returns the destination the client of c connected to before NAT
// redirected it. c must be a *net.TCPConn accepted by a listener (or another
// net.Conn with a SyscallConn method on a TCP socket). The result is
// unmapped: an IPv4 connection accepted on a dual-stack [::] listener
// reports 10.9.9.9:443, not [::ffff:10.9.9.9]:443.
//
// A connection that conntrack tracked but no rule translated returns its
// own local address. A connection conntrack did not track (no NAT or
// conntrack rule in the namespace) fails with an error wrapping
// unix.ENOENT; without the conntrack module loaded, unix.ENOPROTOOPT.
func Get(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	local, isTCP := c.LocalAddr().(*net.TCPAddr)
	if !ok || !isTCP {
		return netip.AddrPort{}, ErrNotTCP
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: %w", err)
	}
	var ap netip.AddrPort
	var serr error
	ctlErr := rc.Control(func(fd uintptr) {
		// The family of the connection, not of the socket, picks the
		// option: an IPv4 connection on an AF_INET6 socket (::ffff:a.b.c.d)
		// is tracked as IPv4, and SOL_IP reaches it (the kernel's
		// ipv6_getsockopt hands SOL_IP to ip_getsockopt).
		if local.IP.To4() != nil {
			ap, serr = get4(int(fd))
		} else {
			ap, serr = get6(int(fd))
		}
	})
	if ctlErr != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: %w", ctlErr)
	}
	return ap, serr
}

// get4 reads SO_ORIGINAL_DST into a sockaddr_in.
func get4(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet4
	if err := getsockopt(fd, unix.SOL_IP, soOriginalDst, unsafe.Pointer(&sa), unix.SizeofSockaddrInet4); err != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: getsockopt SO_ORIGINAL_DST: %w", err)
	}
	if sa.Family != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("origdst: SO_ORIGINAL_DST returned address family %d", sa.Family)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port)), nil
}

// get6 reads IP6T_SO_ORIGINAL_DST into a sockaddr_in6. The zone (scope ID)
// is dropped: a redirected connection to a link-local address is not one
// egressd could dial anyway.
func get6(fd int) (netip.AddrPort, error) {
	var sa unix.RawSockaddrInet6
	if err := getsockopt(fd, unix.SOL_IPV6, ip6tSoOriginalDst, unsafe.Pointer(&sa), unix.SizeofSockaddrInet6); err != nil {
		return netip.AddrPort{}, fmt.Errorf("origdst: getsockopt IP6T_SO_ORIGINAL_DST: %w", err)
	}
	if sa.Family != unix.AF_INET6 {
		return netip.AddrPort{}, fmt.Errorf("origdst: IP6T_SO_ORIGINAL_DST returned address family %d", sa.Family)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), ntohs(sa.Port)), nil
}

// getsockopt is getsockopt(2) into a caller-sized buffer. x/sys/unix has no
// typed getter for a sockaddr result (the common trick of reading it through
// GetsockoptIPv6Mreq or GetsockoptIPv6MTUInfo relies on those structs'
// layouts), so the syscall is made directly with the exact struct.
func getsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// ntohs converts the port of a raw sockaddr, which is in network byte order
// in memory, to its value.
func ntohs(port uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&port))
	return uint16(b[0])<<8 | uint16(b[1])
}
