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

// tunnel splices the client connection and up, a tunnel to t, until both directions
// end, or a change of state refuses it (redecide.go). The bytes already read from the
// client (its ClientHello, and whatever is buffered) go first.
func (c *conn) tunnel(snap *Snapshot, t allowlist.Target, up net.Conn, hello *clientHello, rec *Record) {
	defer up.Close()
	o := &openConn{target: t, upstream: upstreamAddr(up.RemoteAddr()),
		sniless: c.route.mode == modeTransparent && hello.serverName == "",
		close:   func() { c.nc.Close(); up.Close() }}
	c.s.register(o)
	defer c.s.unregister(o)
	defer o.ended(rec)
	c.tunneling.Store(true)
	c.s.metrics.TunnelsActive.Inc()
	defer c.s.metrics.TunnelsActive.Dec()
	early := hello.raw
	if n := c.br.Buffered(); n > 0 {
		buffered, _ := c.br.Peek(n)
		early = append(early, buffered...)
	}
	if _, err := up.Write(early); err != nil {
		return
	}
	rec.BytesIn += int64(len(early))
	c.br, c.bw = nil, nil // a tunnel holds no buffers
	idle := snap.Limits.TunnelIdle
	done := make(chan int64, 1)
	go func() {
		n, _ := pipe(up, c.nc, idle, c.nc, up)
		done <- n
	}()
	out, _ := pipe(&clientWriter{Conn: c.nc, d: snap.Limits.ClientWrite}, up, idle, c.nc, up)
	rec.BytesOut += out
	rec.BytesIn += <-done
}

// pipe copies src to dst until src ends, then half-closes dst. Each read may wait up
// to idle; when it times out the tunnel is kept if either connection received data
// within idle (asked of the kernel: the other direction's reads do not report here).
// On any other error both connections are closed so the opposite direction ends too.
func pipe(dst, src net.Conn, idle time.Duration, a, b net.Conn) (int64, error) {
	var total int64
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := relay(dst, src)
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

// rawConn is c's socket, for the calls net.Conn has no method for.
func rawConn(c net.Conn) (syscall.RawConn, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, false
	}
	raw, err := sc.SyscallConn()
	return raw, err == nil
}

// recentlyActive reports whether c received data within d, from TCP_INFO.
func recentlyActive(c net.Conn, d time.Duration) bool {
	raw, ok := rawConn(c)
	if !ok {
		return false
	}
	var info *unix.TCPInfo
	var err error
	raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO) })
	if err != nil || info == nil {
		return false
	}
	return time.Duration(info.Last_data_recv)*time.Millisecond < d
}

// serveUpgrade completes a 101 Switching Protocols (WebSocket and the like) to x:
// the response goes to the client, then bytes are spliced both ways, the client's
// read through x.upgradeSource, until either side ends, a placeholder in what the
// client sends ends both, or a change of state refuses the connection (redecide.go).
func (c *conn) serveUpgrade(x *exchange, resp *http.Response) {
	rec := x.rec
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		c.writeRefusal(c.s.Snapshot(), rec, errors.New("upgrade response without a connection"), 0)
		return
	}
	defer up.Close()
	o := &openConn{target: x.target, scheme: x.scheme, upstream: resolvedAddr(rec, x.target.Port),
		credential: rec.Credential, close: func() { c.nc.Close(); up.Close() }}
	c.s.register(o)
	defer c.s.unregister(o)
	defer o.ended(rec)
	c.tunneling.Store(true)
	rec.Status = resp.StatusCode
	hdr := resp.Header.Clone()
	removeHopByHop(hdr)
	hdr.Set("Connection", "Upgrade")
	hdr.Set("Upgrade", resp.Header.Get("Upgrade"))
	writeHead(c.bw, resp.StatusCode, hdr, false)
	if err := c.bw.Flush(); err != nil {
		return
	}
	idle := watchIdle(x.snap.Limits.StreamIdle, o.close)
	defer idle.stop()
	done := make(chan int64, 1)
	src := x.upgradeSource(idle.reader(c.br), resp.Header.Get("Upgrade"))
	go func() {
		n, err := io.Copy(up, src)
		if err != nil { // the other direction ends too
			c.nc.Close()
			up.Close()
		}
		done <- n
	}()
	n, _ := io.Copy(&clientWriter{Conn: c.nc, d: c.s.Snapshot().Limits.ClientWrite}, idle.reader(up))
	c.nc.Close()
	up.Close()
	rec.BytesOut += n
	rec.BytesIn += <-done
}
