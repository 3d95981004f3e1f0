// Package hookflood is the fake pre-tool call flood: the sandbox posing as the
// agent runtime as fast as it can, each fake call a new connection to egressd's
// proxy listener (CONNECT to the hook host, TLS, a POST whose body never ends),
// and the real calls measured beside it. The conformance suite and the bench's
// "hook under attack" row both run it.
//
// The flood runs in a child process of its own (Start): in the process that makes
// the real calls, thousands of flood goroutines would starve the one real call of
// the Go scheduler, and the real call's latency would measure the test client,
// not egressd. Every flood is bounded in rate, duration, connections open at once
// and each connection's life.
package hookflood

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options describe one flood.
type Options struct {
	Proxy string // egressd's proxy listener, host:port
	Host  string // the hook host: CONNECT target and SNI
	Port  int    // the hook URL's port; 0 means 443
	Path  string // the hook URL's path
	// Rate is how many fake calls begin each second, for For; each connection
	// lives at most Hold, and at most MaxOpen are open at once.
	Rate    int
	For     time.Duration
	Hold    time.Duration
	MaxOpen int
}

// Stats are what one flood did.
type Stats struct {
	Begun    int64   `json:"begun"`     // connections dialled
	Posted   int64   `json:"posted"`    // fake calls that got through CONNECT and TLS and sent their POST
	PeakOpen int64   `json:"peak_open"` // connections open at once, at most
	Seconds  float64 `json:"seconds"`   // how long it ran
}

// Rate is the fake calls begun per second.
func (s Stats) Rate() float64 { return float64(s.Begun) / s.Seconds }

// PostRate is the fake calls per second that reached their POST.
func (s Stats) PostRate() float64 { return float64(s.Posted) / s.Seconds }

// Run floods until o.For has passed or ctx ends, then waits for its connections
// to close.
func Run(ctx context.Context, o Options) Stats {
	ctx, cancel := context.WithTimeout(ctx, o.For)
	defer cancel()
	f := &flood{o: o, ctx: ctx}
	start := time.Now()
	const tick = 10 * time.Millisecond
	perTick := max(1, o.Rate*int(tick)/int(time.Second))
	next := start
	for ctx.Err() == nil {
		for range perTick {
			if f.open.Load() >= int64(o.MaxOpen) {
				break
			}
			f.begun.Add(1)
			f.wg.Go(f.fakeCall)
		}
		next = next.Add(tick)
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(next)):
		}
	}
	s := Stats{Begun: f.begun.Load(), Seconds: time.Since(start).Seconds()}
	f.wg.Wait()
	s.Posted, s.PeakOpen = f.posted.Load(), f.peakOpen.Load()
	return s
}

type flood struct {
	o                             Options
	ctx                           context.Context // ends the flood's connections
	begun, posted, open, peakOpen atomic.Int64
	wg                            sync.WaitGroup
}

// fakeCall is one fake pre-tool call: CONNECT to the hook host, TLS, a POST head
// declaring a body of which one byte ever comes; held until egressd ends it,
// Hold passes or the flood ends. The client does as little as it can (no
// certificate check, X25519 alone): the cost is egressd's.
func (f *flood) fakeCall() {
	open := f.open.Add(1)
	defer f.open.Add(-1)
	for peak := f.peakOpen.Load(); open > peak && !f.peakOpen.CompareAndSwap(peak, open); peak = f.peakOpen.Load() {
	}
	nc, err := net.DialTimeout("tcp", f.o.Proxy, 2*time.Second)
	if err != nil {
		return
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(f.o.Hold))
	stop := context.AfterFunc(f.ctx, func() { nc.Close() })
	defer stop()
	authority := hostPort(f.o.Host, f.o.Port)
	br, err := connect(nc, authority)
	if err != nil {
		return
	}
	tc := tls.Client(&bufConn{Conn: nc, r: br}, &tls.Config{ServerName: f.o.Host, InsecureSkipVerify: true,
		NextProtos: []string{"http/1.1"}, CurvePreferences: []tls.CurveID{tls.X25519}, MinVersion: tls.VersionTLS13})
	if tc.Handshake() != nil {
		return
	}
	if _, err := fmt.Fprintf(tc, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000000\r\n\r\nx", f.o.Path, authority); err != nil {
		return
	}
	f.posted.Add(1)
	io.Copy(io.Discard, tc)
}

// hostPort is host:port, port 0 meaning 443.
func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(cmp.Or(port, 443)))
}

// connect sends a CONNECT to authority on nc and reads egressd's 200.
func connect(nc net.Conn, authority string) (*bufio.Reader, error) {
	if _, err := fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority); err != nil {
		return nil, err
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("CONNECT: %d %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"))
	}
	return br, nil
}

// bufConn reads through r what was buffered past a CONNECT answer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Outcomes of a real call (Call).
const (
	Allow = "allow" // the endpoint's allow
	Deny  = "deny"  // a deny: the endpoint's, or egressd's fail-closed one
)

// Caller makes pre-tool hook calls as the runtime does, each on a new
// connection to Proxy: CONNECT to the hook host, TLS trusting Roots, a POST of
// Body (a small tool call when nil) to Path.
type Caller struct {
	Proxy string
	Host  string
	Port  int // 0 means 443
	Path  string
	Body  []byte
	Roots *x509.CertPool
}

// Call makes one call and returns Allow, Deny, or what went wrong instead (a
// transport error, another status), with how long the call took; within bounds
// it.
func (c Caller) Call(within time.Duration) (string, time.Duration) {
	start := time.Now()
	o := c.call(start.Add(within))
	return o, time.Since(start)
}

func (c Caller) call(deadline time.Time) string {
	nc, err := net.DialTimeout("tcp", c.Proxy, time.Until(deadline))
	if err != nil {
		return "dial: " + err.Error()
	}
	defer nc.Close()
	nc.SetDeadline(deadline)
	authority := hostPort(c.Host, c.Port)
	br, err := connect(nc, authority)
	if err != nil {
		return "CONNECT: " + err.Error()
	}
	tc := tls.Client(&bufConn{Conn: nc, r: br}, &tls.Config{ServerName: c.Host, RootCAs: c.Roots, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return "TLS: " + err.Error()
	}
	body := c.Body
	if body == nil {
		body = []byte(`{"tool":"code_execution","input":"ls"}`)
	}
	fmt.Fprintf(tc, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		c.Path, authority, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(tc), &http.Request{Method: http.MethodPost})
	if err != nil {
		return "POST: " + err.Error()
	}
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return "POST body: " + err.Error()
	case resp.StatusCode != http.StatusOK:
		return fmt.Sprintf("POST: %d %s", resp.StatusCode, b)
	}
	var d struct{ Decision string }
	if json.Unmarshal(b, &d) != nil || d.Decision != Allow && d.Decision != Deny {
		return "not a decision: " + string(b)
	}
	return d.Decision
}

// envOptions carries a child's Options (JSON); the child prints its Stats.
const envOptions = "EGRESSD_HOOKFLOOD"

// Start runs the flood in a child process: bin, or this binary again when bin is
// "". The child must call MainIfChild before anything else.
func Start(bin string, o Options) (*Process, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	if bin == "" {
		bin = os.Args[0]
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), envOptions+"="+string(b))
	cmd.Stderr = os.Stderr
	p := &Process{cmd: cmd}
	cmd.Stdout = &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// Process is a flood running in a child process.
type Process struct {
	cmd *exec.Cmd
	out strings.Builder
}

// Wait waits for the flood to end and returns what it did.
func (p *Process) Wait() (Stats, error) {
	if err := p.cmd.Wait(); err != nil {
		return Stats{}, fmt.Errorf("hook flood: %w", err)
	}
	var s Stats
	err := json.Unmarshal([]byte(p.out.String()), &s)
	return s, err
}

// Stop ends the flood early; Wait still reports it.
func (p *Process) Stop() { p.cmd.Process.Signal(os.Interrupt) }

// MainIfChild runs the flood and exits when this process is a child of Start;
// otherwise it returns at once.
func MainIfChild() {
	raw := os.Getenv(envOptions)
	if raw == "" {
		return
	}
	var o Options
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		fmt.Fprintln(os.Stderr, "hookflood:", err)
		os.Exit(2)
	}
	ctx, cancel := signalContext()
	defer cancel()
	json.NewEncoder(os.Stdout).Encode(Run(ctx, o))
	os.Exit(0)
}

// signalContext ends on SIGINT (Process.Stop).
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}
