package sockets

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/prometheus/procfs"
)

// tcpListen is the state of a listening socket in /proc/net/tcp (TCP_LISTEN).
const tcpListen = 0x0A

// Holder says who holds the port egressd could not bind, for the one line that
// reports it: "pid 1234 (python3)", or "a process of uid 1000" when the socket is
// there but no process that egressd may look into has it open; "" when it finds
// no such socket. It reads /proc/net/{tcp,udp}{,6} for a socket bound to addr (a
// TCP one listening), then /proc/*/fd for that socket's inode: the current network
// namespace's sockets, with no privilege beyond reading the processes of its own
// user (root sees all).
func Holder(network string, addr netip.AddrPort) string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return ""
	}
	inode, uid, ok := boundInode(fs, network, addr)
	if !ok {
		return ""
	}
	if pid, comm, ok := openedBy(fs, inode); ok {
		return fmt.Sprintf("pid %d (%s)", pid, comm)
	}
	return "a process of uid " + strconv.FormatUint(uid, 10)
}

// socketLine is what Holder reads of a line of /proc/net/{tcp,udp}{,6}.
type socketLine struct {
	addr       netip.AddrPort
	state      uint64
	uid, inode uint64
}

// boundInode finds the inode and owner of the socket bound to addr.
func boundInode(fs procfs.FS, network string, addr netip.AddrPort) (inode, uid uint64, ok bool) {
	for _, l := range socketLines(fs, network) {
		if l.inode == 0 || l.addr.Port() != addr.Port() || (network == TCP && l.state != tcpListen) {
			continue
		}
		if overlaps(l.addr.Addr(), addr.Addr()) {
			return l.inode, l.uid, true
		}
	}
	return 0, 0, false
}

// socketLines reads the IPv4 and IPv6 tables of network. The tables are read
// whole: this runs once, when egressd cannot start.
func socketLines(fs procfs.FS, network string) []socketLine {
	var out []socketLine
	//lint:ignore SA1019 the deprecation points at sock_diag for large tables; this reads the current namespace's once, when egressd cannot start, with no netlink dependency
	read := []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6}
	if network == UDP {
		read = []func() (procfs.NetTCP, error){
			func() (procfs.NetTCP, error) { u, err := fs.NetUDP(); return procfs.NetTCP(u), err },
			func() (procfs.NetTCP, error) { u, err := fs.NetUDP6(); return procfs.NetTCP(u), err },
		}
	}
	for _, f := range read {
		lines, err := f()
		if err != nil {
			continue
		}
		for _, l := range lines {
			ip, ok := netip.AddrFromSlice(l.LocalAddr)
			if !ok {
				continue
			}
			out = append(out, socketLine{netip.AddrPortFrom(ip.Unmap(), uint16(l.LocalPort)), l.St, l.UID, l.Inode})
		}
	}
	return out
}

// overlaps reports whether a socket bound to held keeps a bind to want out: the
// same address, or either is a wildcard.
func overlaps(held, want netip.Addr) bool {
	held, want = held.Unmap(), want.Unmap()
	return held == want || held.IsUnspecified() || want.IsUnspecified()
}

// openedBy finds a process that has the socket inode open, and its command name.
func openedBy(fs procfs.FS, inode uint64) (int, string, bool) {
	procs, err := fs.AllProcs()
	if err != nil {
		return 0, "", false
	}
	target := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, p := range procs {
		fds, err := p.FileDescriptorTargets()
		if err != nil || !slices.Contains(fds, target) {
			continue
		}
		comm, _ := p.Comm()
		return p.PID, comm, true
	}
	return 0, "", false
}
