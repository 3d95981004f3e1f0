package conformance_test

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/egressd/egressd/internal/membudget"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// What an open connection costs egressd, by what it holds: the figures behind
// membudget's connection costs (costs.go), which every accepted connection
// reserves from the memory budget. Each kind runs on an egressd of its own (RSS a
// process has once reached does not come back at once, so kinds measured one
// after another in one process would hide each other's cost): costConns
// connections of the kind are opened and held, and the growth of egressd's RSS
// divided by their number is the kind's cost. RSS, not the heap, because RSS is
// what the OOM killer counts: goroutine stacks, the collector's headroom and the
// runtime's own structures included.

// costConns is how many connections of each kind are held (fewer in a race
// build, whose figures are not the shipped build's and are only logged).
var costConns = 1000 - 800*boolInt(egressdtest.RaceEnabled)

// costKind opens one connection that holds what the kind measures.
type costKind struct {
	name string
	open func(w *world) (net.Conn, error)
	// cost is what membudget reserves for it, which the measure must not pass.
	cost int64
}

func TestConnectionCosts(t *testing.T) {
	tunnel := membudget.ConnCost + membudget.TunnelCost
	for _, kind := range []costKind{
		{"plain idle", attackDial, membudget.ConnCost},
		{"held head", openHeldHead, membudget.ConnCost},
		{"spliced tunnel idle", func(w *world) (net.Conn, error) { return attackTunnel(w, "allowed.test") }, tunnel},
		{"intercepted TLS idle", func(w *world) (net.Conn, error) { return attackTunnel(w, "api.allowed.test") }, tunnel},
		{"intercepted HTTP/2 idle", openH2Idle, tunnel},
		{"intercepted with a held body", openHeldBody, tunnel + membudget.RequestCost},
	} {
		t.Run(kind.name, func(t *testing.T) {
			per := measureConnCost(t, kind)
			t.Logf("%s: %d KiB a connection (reserved: %d KiB)", kind.name, per>>10, kind.cost>>10)
			if !egressdtest.RaceEnabled && per > kind.cost {
				t.Errorf("%s costs %d KiB a connection, more than the %d KiB membudget reserves for it: raise it in membudget's costs.go",
					kind.name, per>>10, kind.cost>>10)
			}
		})
	}
}

// measureConnCost holds costConns connections of kind on an egressd of its own
// and returns the RSS each adds.
func measureConnCost(t *testing.T, kind costKind) int64 {
	w := hooksWorld(t, config{limits: &egressdtest.Limits{Memory: "1GiB"}})
	k := w.begin(t)
	k.get("http://api.allowed.test/warm").Body.Close() // the leaf, the pools, the first TLS
	time.Sleep(500 * time.Millisecond)
	idle := w.rss(t)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range costConns {
		c, err := kind.open(w)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	time.Sleep(time.Second) // egressd has read what they sent
	return (w.rss(t) - idle) / int64(costConns)
}

// openHeldHead sends the start of a request head and holds it.
func openHeldHead(w *world) (net.Conn, error) {
	c, err := attackDial(w)
	if err == nil {
		_, err = io.WriteString(c, "GET http://allowed.test/held HTTP/1.1\r\nHost: allowed.test\r\nX-Held: ")
	}
	return c, err
}

// openHeldBody is the request of the proven OOM: in an intercepted tunnel, a POST
// declaring heldBodyLength bytes of body, one of them sent, then held; egressd has
// forwarded it upstream and waits for the rest.
func openHeldBody(w *world) (net.Conn, error) {
	c, err := attackTunnel(w, "api.allowed.test")
	if err == nil {
		_, err = fmt.Fprintf(c, "POST /held HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: %d\r\n\r\nx", heldBodyLength)
	}
	return c, err
}

// heldBodyLength is what a held request declares.
const heldBodyLength = 100000

// openH2Idle is an intercepted HTTP/2 connection, its preface and settings sent,
// no stream open.
func openH2Idle(w *world) (net.Conn, error) {
	tc, err := attackTunnelALPN(w, "api.allowed.test", "h2")
	if err != nil {
		return nil, err
	}
	io.WriteString(tc, http2.ClientPreface)
	http2.NewFramer(tc, nil).WriteSettings()
	return tc, nil
}
