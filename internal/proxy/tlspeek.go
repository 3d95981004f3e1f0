package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"time"
)

var errPeeked = errors.New("ClientHello read")

// recordTypeHandshake is the first byte of a TLS handshake record (RFC 8446 §5.1),
// which a ClientHello starts with; anything else is taken for plain HTTP.
const recordTypeHandshake = 0x16

// alertUnrecognizedName is a fatal TLS alert record, unrecognized_name (RFC 8446
// §6.2, alert 112), sent when a tunnel's SNI names another host.
var alertUnrecognizedName = []byte{21, 3, 3, 0, 2, 2, 112}

// clientHello is what egressd reads from a ClientHello before deciding what to do
// with the connection, and the bytes it read to learn it.
type clientHello struct {
	serverName string
	alpn       []string
	raw        []byte // the bytes read from the client; they are replayed
	// ech: the hello carries encrypted_client_hello (RFC 9849), real or GREASE; its
	// inner hello may name any host behind the same edge.
	ech bool
}

// extensionECH is the encrypted_client_hello extension's code point.
const extensionECH = 0xfe0d

// maxClientHello bounds the bytes read while looking for a ClientHello.
const maxClientHello = 64 << 10

// peekClientHello parses the client's ClientHello with crypto/tls itself. The bytes
// it reads are kept in the result, so the connection can still be spliced or
// terminated by replaying them. The handshake stops inside GetConfigForClient;
// nothing is written to the client.
func peekClientHello(r io.Reader) (*clientHello, error) {
	hello := &clientHello{}
	rec := &recordingConn{r: io.LimitReader(r, maxClientHello), hello: hello}
	var got bool
	err := tls.Server(rec, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello.serverName, got = h.ServerName, true
			hello.alpn = append([]string(nil), h.SupportedProtos...)
			hello.ech = slices.Contains(h.Extensions, extensionECH)
			return nil, errPeeked
		},
	}).Handshake()
	if !got {
		return nil, err
	}
	return hello, nil
}

// recordingConn feeds crypto/tls and keeps every byte it reads; writes (the alert
// crypto/tls sends when the peek stops it) go nowhere.
type recordingConn struct {
	r     io.Reader
	hello *clientHello
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.hello.raw = append(c.hello.raw, b[:n]...)
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *recordingConn) Close() error                     { return nil }
func (c *recordingConn) LocalAddr() net.Addr              { return nil }
func (c *recordingConn) RemoteAddr() net.Addr             { return nil }
func (c *recordingConn) SetDeadline(time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }

// replayConn is a client connection whose first bytes were already read: they are
// read again first.
type replayConn struct {
	net.Conn
	r     io.Reader
	wrote bool // egressd has written to the client (its ServerHello); one goroutine handshakes
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *replayConn) Write(p []byte) (int, error) {
	c.wrote = true
	return c.Conn.Write(p)
}
