//go:build !linux

package origdst

import (
	"net"
	"net/netip"
)

// Get returns ErrUnsupported: only Linux has SO_ORIGINAL_DST.
func Get(net.Conn) (netip.AddrPort, error) { return netip.AddrPort{}, ErrUnsupported }
