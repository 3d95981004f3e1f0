package scrub

import (
	"bytes"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"golang.org/x/net/websocket"
)

// upgradedConn is the client's side of a real WebSocket connection with
// the server-to-client bytes after the 101 response read through the
// scrubber, as the proxy will relay them. The response head is read a byte
// at a time so nothing of the frames is read before the switch.
type upgradedConn struct {
	net.Conn
	set  *Set
	head []byte
	ws   *Reader
}

func (c *upgradedConn) Read(p []byte) (int, error) {
	if c.ws != nil {
		return c.ws.Read(p)
	}
	n, err := c.Conn.Read(p[:1])
	c.head = append(c.head, p[:n]...)
	if bytes.HasSuffix(c.head, []byte("\r\n\r\n")) {
		c.ws = c.set.WebSocket(c.Conn)
	}
	return n, err
}

// TestWebSocketInterop runs a real WebSocket server and client (x/net) over
// loopback TCP: the messages the client library receives are masked, and it
// parses every frame the scrubber released.
func TestWebSocketInterop(t *testing.T) {
	v := testValues[0]
	big := strings.Repeat("x", 70000) + v
	srv := httptest.NewServer(websocket.Handler(func(ws *websocket.Conn) {
		var req string
		if err := websocket.Message.Receive(ws, &req); err != nil {
			return
		}
		_ = websocket.Message.Send(ws, "echo: "+req)
		_ = websocket.Message.Send(ws, []byte("\x00binary "+v+"\xff"))
		_ = websocket.Message.Send(ws, big)
		_ = websocket.Message.Send(ws, "bye")
	}))
	defer srv.Close()
	cfg, err := websocket.NewConfig(strings.Replace(srv.URL, "http", "ws", 1), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := Compile(v)
	conn := &upgradedConn{Conn: raw, set: s}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := websocket.Message.Send(ws, "token="+v); err != nil {
		t.Fatal(err)
	}
	mask := strings.Repeat("*", len(v))
	var text string
	var bin []byte
	for i, want := range []string{"echo: token=" + mask, "\x00binary " + mask + "\xff", strings.Repeat("x", 70000) + mask, "bye"} {
		var got string
		if i == 1 {
			err = websocket.Message.Receive(ws, &bin)
			got = string(bin)
		} else {
			err = websocket.Message.Receive(ws, &text)
			got = text
		}
		if err != nil || got != want {
			t.Fatalf("message %d: %.80q, %v", i, got, err)
		}
	}
	if conn.ws.Count() != 3 {
		t.Errorf("Count = %d, want 3", conn.ws.Count())
	}
}
