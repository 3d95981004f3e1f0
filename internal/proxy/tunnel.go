package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/allowlist"
)

// serveConnect serves a CONNECT: decide on the authority, dial a checked address,
// answer 200 and splice bytes until either side is done. A refused CONNECT gets the
// refusal instead of 200 and the connection stays usable.
func (c *conn) serveConnect(rt *Runtime, req *http.Request, rec *Record) bool {
	rec.Scheme = "connect"
	t, err := allowlist.ParseAuthority(req.RequestURI, 0)
	if err != nil {
		err = badRequest("connect_target", err)
	} else {
		rec.setTarget(t)
		err = decide(rt, t, "", rec)
	}
	if err != nil {
		c.writeRefusal(rt, rec, err, 0)
		return !req.Close
	}
	up, err := rt.dialTarget(c.ctx, t)
	if err != nil {
		c.writeRefusal(rt, rec, err, 0)
		return !req.Close
	}
	rec.setResolved(up.RemoteAddr())
	rec.Status = http.StatusOK
	c.bw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n")
	if err := c.bw.Flush(); err != nil {
		up.Close()
		return false
	}
	c.tunnel(rt, up, rec)
	return false
}

// tunnel splices the client connection and up until both directions end. Bytes the
// client sent ahead of the 200 (already in the read buffer) go first.
func (c *conn) tunnel(rt *Runtime, up net.Conn, rec *Record) {
	defer up.Close()
	c.s.metrics.TunnelsActive.Inc()
	defer c.s.metrics.TunnelsActive.Dec()
	if n := c.br.Buffered(); n > 0 {
		early, _ := c.br.Peek(n)
		if _, err := up.Write(early); err != nil {
			return
		}
		rec.BytesIn += int64(n)
	}
	c.br, c.bw = nil, nil // a tunnel holds no buffers
	idle := rt.Limits.TunnelIdle
	done := make(chan int64, 1)
	go func() {
		n, _ := pipe(up, c.nc, idle, c.nc, up)
		done <- n
	}()
	out, _ := pipe(c.nc, up, idle, c.nc, up)
	rec.BytesOut += out
	rec.BytesIn += <-done
}

// pipe copies src to dst until src ends, then half-closes dst. Each read may wait up
// to idle; when it times out the tunnel is kept if either connection received data
// within idle (asked of the kernel, so the copy itself can stay a splice). On any
// other error both connections are closed so the opposite direction ends too.
func pipe(dst, src net.Conn, idle time.Duration, a, b net.Conn) (int64, error) {
	var total int64
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := io.Copy(dst, src)
		total += n
		switch {
		case err == nil:
			closeWrite(dst)
			return total, nil
		case isTimeout(err) && (n > 0 || recentlyActive(a, idle) || recentlyActive(b, idle)):
			continue
		default:
			a.Close()
			b.Close()
			return total, err
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// recentlyActive reports whether c received data within d, from TCP_INFO.
func recentlyActive(c net.Conn, d time.Duration) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var info *unix.TCPInfo
	raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO) })
	if err != nil || info == nil {
		return false
	}
	return time.Duration(info.Last_data_recv)*time.Millisecond < d
}

// serveUpgrade completes a 101 Switching Protocols (WebSocket and the like): the
// response goes to the client, then bytes are spliced both ways.
func (c *conn) serveUpgrade(resp *http.Response, rec *Record) {
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		c.writeRefusal(c.s.Runtime(), rec, errors.New("upgrade response without a connection"), 0)
		return
	}
	defer up.Close()
	rec.Status = resp.StatusCode
	hdr := resp.Header.Clone()
	removeHopByHop(hdr)
	hdr.Set("Connection", "Upgrade")
	hdr.Set("Upgrade", resp.Header.Get("Upgrade"))
	writeHead(c.bw, resp.StatusCode, hdr, false)
	if err := c.bw.Flush(); err != nil {
		return
	}
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, c.br)
		done <- n
	}()
	n, _ := io.Copy(c.nc, up)
	c.nc.Close()
	up.Close()
	rec.BytesOut += n
	rec.BytesIn += <-done
}
