package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The "hook under attack" row (issue 12): the hook row's calls, made while
// attackConns connections hold egressd's listener, half of them posing as the
// runtime (a tunnel to the hook host and a hook call whose body trickles in one
// byte every 500 ms, reopened when egressd answers it with the deny at the hook's
// deadline), half tunnels to the upstream with TLS done and then idle. Beside the
// hook row, it shows what holding connections costs the runtime's hook calls.
const (
	hookAttackRow = "hook-attack"
	attackConns   = 200
)

// measureHookUnderAttack runs one round of the hook calls through egressd while
// the attack holds its connections; direct is the hook row's last direct run.
func measureHookUnderAttack(ctx context.Context, env pathEnv, call customTarget, lo loadOptions, direct runResult) (pathResult, error) {
	rb := &rowBuilder{res: pathResult{Path: hookAttackRow, Description: fmt.Sprintf(
		"the hook row's calls while %d connections hold egressd's listener: %d fake hook calls to the hook URL whose bodies trickle (1 byte / 500 ms, reopened when denied) and %d idle tunnels to the upstream",
		attackConns, attackConns/2, attackConns/2), Injects: call.method + " as the hook row"}}
	proxyAddr := strings.TrimPrefix(env.w.proxy, "http://")
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
					trickleHookCall(proxyAddr, env.w.up.hook.url(hookURLPath), env.w.egressdRoots, stop)
				} else {
					idleTunnel(proxyAddr, env.w.up.tlsAddr, env.w.up.roots, stop)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(2 * time.Second) // the attack's connections are in place
	before := env.w.up.hook.counts()
	x, err := measureVia(env.e, env.dns, func(cpu func() (time.Duration, error)) (runResult, error) {
		return runCustomLoad(ctx, call, lo, cpu)
	})
	if err != nil {
		return pathResult{}, fmt.Errorf("hook calls under attack: %w", err)
	}
	x.r.fillHook(env.w.up.hook.counts().sub(before)) // the fake calls' bodies never arrive: only the measured calls count
	rb.add(direct, x)
	return rb.finish(env.e), nil
}

// attackTunnel opens a CONNECT tunnel to authority through egressd and
// completes TLS with sni inside it.
func attackTunnel(proxyAddr, authority, sni string, roots *x509.CertPool) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", proxyAddr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprintf(nc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	resp, err := http.ReadResponse(bufio.NewReader(nc), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		nc.Close()
		return nil, fmt.Errorf("CONNECT %s: %v", authority, err)
	}
	tc := tls.Client(nc, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		nc.Close()
		return nil, err
	}
	return tc, nil
}

// trickleHookCall poses as the runtime: a hook call whose body never quite arrives.
func trickleHookCall(proxyAddr, hookURL string, roots *x509.CertPool, stop <-chan struct{}) {
	host := strings.TrimPrefix(hookURL, "https://")
	host = host[:strings.IndexByte(host, '/')]
	c, err := attackTunnel(proxyAddr, host, hookHost, roots)
	if err != nil {
		return
	}
	defer c.Close()
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
func idleTunnel(proxyAddr, upstreamTLS string, roots *x509.CertPool, stop <-chan struct{}) {
	c, err := attackTunnel(proxyAddr, localhostAddr(upstreamTLS), "localhost", roots)
	if err != nil {
		time.Sleep(time.Second)
		return
	}
	defer c.Close()
	<-stop
}
