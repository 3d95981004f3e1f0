package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The "hook under attack" row (issue 12): the hook row's calls, made while
// attackConns connections hold the listener of an egressd of its own, whose
// limits.max_connections is attackMaxConnections: the attack fills it, so the
// hook lane (internal/proxy/lane.go) is what serves the measured calls. Half
// the attackers pose as the runtime (a tunnel to the hook host and a hook call
// whose body trickles in one byte every 500 ms, reopened when egressd cuts or
// denies it), half hold tunnels to the upstream with TLS done and then idle.
// Beside the hook row, it shows what a full listener costs the runtime's calls.
const (
	hookAttackRow        = "hook-attack"
	attackConns          = 200
	attackMaxConnections = 128 // below attackConns: the listener is full
	// attackClients bounds the measured hook callers: a runtime makes one
	// pre-tool call at a time, and more callers than the lane's 32 slots would
	// cut each other's calls (the newest arrival cuts the oldest).
	attackClients = 8
)

// attackSummary is what the hook-attack row's attack held: how many of its
// connections had their tunnel up, and what an ordinary request got meanwhile.
type attackSummary struct {
	Conns          int `json:"conns"`
	MaxConnections int `json:"max_connections"`
	// Held is the attack's tunnels that were up just before and just after
	// the measured window.
	HeldBefore int64 `json:"held_before"`
	HeldAfter  int64 `json:"held_after"`
	// ProbeStatus is the status of an ordinary GET through egressd during
	// the attack (503 when the listener is full), ProbeReason its reason header.
	ProbeStatus int    `json:"probe_status"`
	ProbeReason string `json:"probe_reason,omitempty"`
	// Refused is egressd's log lines for the attackers' own connections:
	// tunnels refused 503 overloaded, fake calls cut from the lane or denied
	// at the body deadline. Moved out of the row's unexpected lines; a measured
	// call cut or denied still counts as a client error (Egressd-Hook: fail-closed).
	Refused map[string]int64 `json:"refused,omitempty"`
}

// attackLine tells the log keys (unexpectedKey) of the attack's own refusals.
var attackLine = regexp.MustCompile(`reason=overloaded|detail=body_timeout`)

func (s *attackSummary) takeAttackLines(log *logSummary) {
	for k, n := range log.Unexpected {
		if attackLine.MatchString(k) {
			addCount(&s.Refused, k, n)
			delete(log.Unexpected, k)
		}
	}
	if len(log.Unexpected) == 0 {
		log.Unexpected, log.Examples = nil, nil
	}
}

// measureHookUnderAttack runs one round of the hook calls through an egressd
// started for the row while the attack holds its connections; direct is the
// hook row's last direct run.
func measureHookUnderAttack(ctx context.Context, env pathEnv, direct, call customTarget, lo loadOptions) (pathResult, error) {
	rb := &rowBuilder{res: pathResult{Path: hookAttackRow, Description: fmt.Sprintf(
		"the hook row's calls, from at most %d clients, through an egressd with limits.max_connections %d while %d connections hold its listener: %d fake hook calls to the hook URL whose bodies trickle (1 byte / 500 ms, reopened when cut) and %d idle tunnels to the upstream",
		attackClients, attackMaxConnections, attackConns, attackConns/2, attackConns/2), Injects: call.method + " as the hook row"}}
	ae, roots, err := startAttackEgressd(ctx, env)
	if err != nil {
		return pathResult{}, fmt.Errorf("%s: %w", hookAttackRow, err)
	}
	defer ae.stop()
	call.proxy, call.roots = ae.proxyURL, roots
	lo.clients = min(lo.clients, attackClients)
	proxyAddr := strings.TrimPrefix(ae.proxyURL, "http://")
	sum := &attackSummary{Conns: attackConns, MaxConnections: attackMaxConnections}
	var held atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range attackConns {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if i%2 == 0 {
					trickleHookCall(proxyAddr, env.w.up.hook.url(hookURLPath), roots, &held, stop)
				} else {
					idleTunnel(proxyAddr, env.w.up.tlsAddr, env.w.up.roots, &held, stop)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	before := env.w.up.hook.counts()
	d, err := runCustomLoad(ctx, direct, lo, nil) // with the row's client count, before the attack
	if err != nil {
		return pathResult{}, fmt.Errorf("direct: %w", err)
	}
	d.fillHook(env.w.up.hook.counts().sub(before))
	time.Sleep(3 * time.Second) // the attack's connections are in place
	sum.ProbeStatus, sum.ProbeReason = probeOrdinary(proxyAddr, localhostAddr(env.w.up.httpAddr))
	sum.HeldBefore = held.Load()
	before = env.w.up.hook.counts()
	x, err := measureVia(ae, env.dns, func(cpu func() (time.Duration, error)) (runResult, error) {
		return runCustomLoad(ctx, call, lo, cpu)
	})
	if err != nil {
		return pathResult{}, fmt.Errorf("hook calls under attack: %w", err)
	}
	sum.HeldAfter = held.Load()
	x.r.fillHook(env.w.up.hook.counts().sub(before)) // the fake calls' bodies never arrive: only the measured calls count
	rb.add(d, x)
	res := rb.finish(ae)
	sum.takeAttackLines(&res.Log)
	res.Attack = sum
	res.Problems = append(res.Problems, sum.problems()...)
	return res, nil
}

// problems says when the attack did not fill the listener, so the row would
// not measure the hook lane.
func (s *attackSummary) problems() []string {
	if s.ProbeStatus != http.StatusServiceUnavailable {
		return []string{fmt.Sprintf("an ordinary request during the attack got %d, not 503 overloaded: the listener was not full", s.ProbeStatus)}
	}
	if s.HeldBefore < int64(s.MaxConnections) {
		return []string{fmt.Sprintf("the attack held %d tunnels, fewer than limits.max_connections %d", s.HeldBefore, s.MaxConnections)}
	}
	return nil
}

// startAttackEgressd starts the hook-attack row's egressd (same config as the
// first one but for limits.max_connections) in a directory of its own, and
// points the hook endpoint's verifier at its signing key.
func startAttackEgressd(ctx context.Context, env pathEnv) (*egressd, *x509.CertPool, error) {
	cfg, files := benchConfig(env.w.up, env.dns.Addr, nil, attackMaxConnections)
	ae, err := startEgressd(ctx, env.o.egressd, filepath.Join(env.dir, hookAttackRow), cfg, files)
	if err != nil {
		return nil, nil, fmt.Errorf("egressd: %w", err)
	}
	roots, err := ae.CAPool()
	if err == nil {
		var jwks []byte
		if jwks, err = ae.adminGet("/.well-known/jwks.json"); err == nil {
			err = env.w.up.hook.setVerifier(jwks)
		}
	}
	if err != nil {
		ae.stop()
		return nil, nil, err
	}
	return ae, roots, nil
}

// probeOrdinary sends one ordinary GET (no hook call) through egressd at
// proxyAddr and returns its status and Egressd-Reason.
func probeOrdinary(proxyAddr, authority string) (int, string) {
	nc, err := net.DialTimeout("tcp", proxyAddr, 2*time.Second)
	if err != nil {
		return 0, err.Error()
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(nc, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", authority, authority)
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		return 0, err.Error()
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Egressd-Reason")
}

// attackTunnel opens a CONNECT tunnel to authority through egressd and
// completes TLS with sni inside it; the connection then has a minute.
func attackTunnel(proxyAddr, authority, sni string, roots *x509.CertPool) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, err := openTunnel(ctx, proxyAddr, authority, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, err
	}
	_ = tc.SetDeadline(time.Now().Add(time.Minute))
	return tc, nil
}

// trickleHookCall poses as the runtime: a hook call whose body never quite arrives.
func trickleHookCall(proxyAddr, hookURL string, roots *x509.CertPool, held *atomic.Int64, stop <-chan struct{}) {
	host := strings.TrimPrefix(hookURL, "https://")
	host = host[:strings.IndexByte(host, '/')]
	c, err := attackTunnel(proxyAddr, host, hookHost, roots)
	if err != nil {
		return
	}
	defer c.Close()
	held.Add(1)
	defer held.Add(-1)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", hookURLPath, host, hookBodySize)
	for range hookBodySize {
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
		if _, err := c.Write([]byte("x")); err != nil {
			return
		}
	}
}

// idleTunnel holds a tunnel to the upstream, TLS done, until stop.
func idleTunnel(proxyAddr, upstreamTLS string, roots *x509.CertPool, held *atomic.Int64, stop <-chan struct{}) {
	c, err := attackTunnel(proxyAddr, localhostAddr(upstreamTLS), "localhost", roots)
	if err != nil {
		time.Sleep(time.Second)
		return
	}
	defer c.Close()
	held.Add(1)
	defer held.Add(-1)
	<-stop
}
