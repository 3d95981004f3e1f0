package netguard

import (
	"net/netip"
	"sync"
)

// SelfSet is a set of egressd's own listener addresses that changes while the
// Guards built with it (Options.Live) serve: a node's sandboxes' listeners
// outside a network namespace of their own, opened and closed as sandboxes come
// and go, none of which any sandbox may have egressd connect to. Safe for
// concurrent use; a nil SelfSet is empty.
type SelfSet struct {
	mu    sync.RWMutex
	addrs map[netip.AddrPort]int // by bound address; the count of its holders
}

// Add records ap (a bound address) until the matching Remove.
func (s *SelfSet) Add(ap netip.AddrPort) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addrs == nil {
		s.addrs = map[netip.AddrPort]int{}
	}
	s.addrs[ap]++
}

// Remove undoes one Add of ap.
func (s *SelfSet) Remove(ap netip.AddrPort) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addrs[ap]--; s.addrs[ap] <= 0 {
		delete(s.addrs, ap)
	}
}

// has reports whether a connect to ip:port reaches one of the set's listeners:
// the address itself; on a listener bound to an unspecified address, any
// loopback address; from an unspecified ip (the local host), any of them.
func (s *SelfSet) has(ip netip.Addr, port uint16) bool {
	if s == nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.addrs) == 0 {
		return false
	}
	if s.addrs[netip.AddrPortFrom(ip, port)] > 0 {
		return true
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		for _, wild := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
			if s.addrs[netip.AddrPortFrom(wild, port)] > 0 {
				return true
			}
		}
	}
	if ip.IsUnspecified() {
		for ap := range s.addrs {
			if ap.Port() == port {
				return true
			}
		}
	}
	return false
}
