package proxy

import (
	"errors"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// relay copies src to dst until src ends (nil) or fails, and holds a buffer only
// while bytes are in flight: it waits for src on the runtime's poller with nothing
// borrowed, takes a pooled buffer for each read, and returns it before waiting
// again. An idle tunnel therefore costs its two sockets and two goroutines, no
// buffer and no pipe. (io.Copy between TCP connections splices, and Go's splice
// keeps a pipe, two file descriptors, for as long as it waits for data: 6 fds per
// idle tunnel instead of 2, and 10,000 idle tunnels would need 60,000 fds.)
// The syscalls per message are those of a splice: one read, one write, and the
// read that finds nothing and parks.
func relay(dst io.Writer, src net.Conn) (int64, error) {
	sc, ok := src.(syscall.Conn)
	if !ok {
		return io.Copy(dst, src)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return io.Copy(dst, src)
	}
	var total int64
	for {
		bp, n, err := readRaw(raw)
		if n > 0 {
			_, werr := dst.Write((*bp)[:n])
			total += int64(n)
			if werr != nil {
				copyBufs.Put(bp)
				return total, &writeError{werr}
			}
		}
		if bp != nil {
			copyBufs.Put(bp)
		}
		switch {
		case err != nil:
			return total, err
		case n == 0:
			return total, nil // EOF
		}
	}
}

// readRaw reads what src has into a pooled buffer, waiting on the poller (within
// src's read deadline) while there is nothing. bp is nil when nothing was read.
func readRaw(raw syscall.RawConn) (bp *[]byte, n int, err error) {
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		bp = copyBufs.Get().(*[]byte)
		for {
			n, rerr = unix.Read(int(fd), *bp)
			if !errors.Is(rerr, unix.EINTR) {
				break
			}
		}
		if errors.Is(rerr, unix.EAGAIN) {
			copyBufs.Put(bp)
			bp, n = nil, 0
			return false // park until readable, holding nothing
		}
		return true
	})
	if err == nil && rerr != nil {
		err = rerr
	}
	if n < 0 {
		n = 0
	}
	return bp, n, err
}

// writeError is a failed write to relay's destination. It hides the cause's
// Timeout: a write that timed out (a client that reads nothing for
// limits.client_write) ends the tunnel, where a read that timed out only asks
// whether the tunnel is idle.
type writeError struct{ err error }

func (e *writeError) Error() string { return "write: " + e.err.Error() }
