// Package keep lets a worker leave descriptors in its supervising parent's
// keeping, so that they outlive the worker: the sockets node mode opens inside
// sandboxes' network namespaces and the sandbox specs in force. A
// new worker takes back what its predecessor left, so a worker's death leaves no
// moment in which a sandbox's port is free for a process inside it to bind, and no
// registration is forgotten. docs/node.md ("Restarts") is the user's view.
//
// The parent (Store) holds descriptors only: it never reads a spec nor serves a
// socket. The two sides speak over a SOCK_SEQPACKET socket pair, one message a
// record: an operation byte, a key, and at most one descriptor (SCM_RIGHTS).
package keep

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// EnvFD names the descriptor of a worker's end of the pair. The supervising
// parent sets it; Worker unsets it.
const EnvFD = "EGRESSD_WORKER_KEEP_FD"

// The operations. A worker asks for what is kept (opRequest) and gets each
// descriptor (opHold) then opEnd, or asks for one key's (opGet) and gets it
// (opHold) or opEnd; it leaves a descriptor (opHold) and takes one back (opDrop,
// answered by opAck once the parent has closed its copy, so that the worker may
// bind the address again at once).
const (
	opRequest = 'r'
	opGet     = 'g'
	opHold    = 'h'
	opEnd     = 'e'
	opDrop    = 'd'
	opAck     = 'a'
)

// maxKey bounds a key: a sandbox ID, a namespace's identity, a listener name and
// an address, or a socket path.
const maxKey = 1024

// errProtocol is a message neither side sends.
var errProtocol = errors.New("keep: malformed message")

// pair returns the two ends of a new SOCK_SEQPACKET socket pair, close-on-exec.
func pair() (a, b *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("keep: socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "keep"), os.NewFile(uintptr(fds[1]), "keep-worker"), nil
}

// link is one end of a pair.
type link struct{ c *net.UnixConn }

func (l *link) Close() error { return l.c.Close() }

// open turns one end into a link (the file is closed: the connection has a
// descriptor of its own).
func open(f *os.File) (*link, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("keep: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("keep: not a Unix socket")
	}
	return &link{uc}, nil
}

// send writes one message; fd < 0 sends none. The descriptor stays open here.
func (l *link) send(op byte, key string, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := l.c.WriteMsgUnix(append([]byte{op}, key...), oob, nil)
	return err
}

// recv reads one message. A descriptor it carries is the caller's (-1 when none);
// any more are closed. Go reads with MSG_CMSG_CLOEXEC, so what arrives is not
// inherited by a process started later.
func (l *link) recv() (op byte, key string, fd int, err error) {
	buf := make([]byte, 1+maxKey)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := l.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, "", -1, err
	}
	fds := rights(oob[:oobn])
	fd = -1
	if len(fds) > 0 {
		fd = fds[0]
		closeFDs(fds[1:])
	}
	if n == 0 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFD(fd)
		return 0, "", -1, errProtocol
	}
	return buf[0], string(buf[1:n]), fd, nil
}

// rights lists the descriptors in a message's control data.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		closeFD(fd)
	}
}

// dup returns a close-on-exec duplicate of the descriptor sc holds, without
// touching its blocking mode (os.File.Fd would make a socket blocking, and the
// mode belongs to the open file, which the copy shares).
func dup(sc syscall.Conn) (int, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	return nfd, derr
}
