package peeruid

import (
	"encoding/binary"
	"errors"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The kernel's inet_diag structures (linux/inet_diag.h), as far as a lookup
// reads them. vishvananda/netlink's SocketGet asks with NLM_F_DUMP, which walks
// every socket of the namespace for each lookup; without it the kernel looks the
// one socket up (inet_diag_get_exact).
const (
	diagReqLen  = 56 // inet_diag_req_v2
	diagMsgLen  = 72 // inet_diag_msg
	noCookie    = ^uint32(0)
	offState    = 1  // idiag_state
	offUID      = 64 // idiag_uid
	offInode    = 68 // idiag_inode
	allStates   = ^uint32(0)
	sockIDStart = 8
)

// diagRequest is an inet_diag_req_v2 for one TCP socket.
type diagRequest [diagReqLen]byte

func (r *diagRequest) Len() int          { return diagReqLen }
func (r *diagRequest) Serialize() []byte { return r[:] }

// exactRequest asks for the TCP socket whose local address is local and whose
// remote address is remote.
func exactRequest(local, remote *net.TCPAddr) (*nl.NetlinkRequest, error) {
	var r diagRequest
	src, dst := local.IP.To4(), remote.IP.To4()
	r[0] = unix.AF_INET
	if src == nil || dst == nil {
		src, dst, r[0] = local.IP.To16(), remote.IP.To16(), unix.AF_INET6
	}
	if src == nil || dst == nil {
		return nil, errors.New("sock_diag: not an IP address")
	}
	r[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], allStates)
	id := r[sockIDStart:]
	binary.BigEndian.PutUint16(id[0:], uint16(local.Port))
	binary.BigEndian.PutUint16(id[2:], uint16(remote.Port))
	copy(id[4:20], src)
	copy(id[20:36], dst)
	binary.NativeEndian.PutUint32(id[40:], noCookie)
	binary.NativeEndian.PutUint32(id[44:], noCookie)
	req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, 0)
	req.AddData(&r)
	return req, nil
}

// parseDiag reads an inet_diag_msg: the socket's owner, or errNotLive when it is
// no established connection of a live process (closed and kept by the kernel
// alone: no inode, and once in TIME_WAIT a UID that reads 0).
func parseDiag(b []byte) (uint32, error) {
	if len(b) < diagMsgLen {
		return 0, errors.New("sock_diag: short answer")
	}
	uid := binary.NativeEndian.Uint32(b[offUID:])
	if b[offState] != tcpEstablished || binary.NativeEndian.Uint32(b[offInode:]) == 0 {
		return uid, errNotLive
	}
	return uid, nil
}
