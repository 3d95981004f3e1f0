package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/rs/zerolog"
)

// FuzzHookCandidate: whatever a newcomer sends first, the lane's admission read
// never panics, never consumes a byte (serving the connection reads it all again),
// and calls something a hook call only when it names a hook URL or host.
func FuzzHookCandidate(f *testing.F) {
	for _, s := range []string{
		"POST https://policy.test/pre HTTP/1.1\r\nHost: policy.test\r\nContent-Length: 2\r\n\r\n{}",
		"POST https://policy.test/post HTTP/1.1\r\nHost: policy.test\r\n\r\n",
		"CONNECT policy.test:443 HTTP/1.1\r\nHost: policy.test:443\r\n\r\n",
		"CONNECT other.test:443 HTTP/1.1\r\n\r\n",
		"GET https://policy.test/pre HTTP/1.1\r\n\r\n",
		"POST https://policy.test/pre HTTP/1.1\r\nHost: policy.test\r\n",
		"\x16\x03\x01\x00\x05hello",
	} {
		f.Add([]byte(s))
	}
	file, err := hooks.Parse([]byte(`{"g": {"pre_tool_execution": [{"matcher": "*", "hooks": [
		{"type": "http", "url": "https://policy.test/pre", "timeout": 2}]}],
		"post_tool_execution": [{"matcher": "*", "hooks": [{"type": "http", "url": "https://policy.test/post"}]}]}}`))
	if err != nil {
		f.Fatal(err)
	}
	snap := &Snapshot{Hooks: &Hooks{Index: hooks.NewIndex(file)}, Limits: config.Default().Limits}
	s := New(snap, zerolog.Nop(), nil)
	l := &listener{cfg: config.Listener{Name: "sandbox", Mode: config.ModeProxy, Role: config.RoleSandbox}}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() { b.Write(data); b.Close() }()
		a.SetDeadline(time.Now().Add(time.Second))
		c := newConn(s, l, a)
		got := c.hookCandidate(snap)
		rest, _ := io.ReadAll(c.br)
		if !bytes.Equal(rest, data) {
			t.Fatalf("the admission read consumed bytes: %q left of %q", rest, data)
		}
		if got && !bytes.Contains(data, []byte("policy.test")) {
			t.Fatalf("%q taken for a hook call", data)
		}
	})
}
