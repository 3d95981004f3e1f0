// Command goproxybare is a bare github.com/elazarl/goproxy forward proxy, one of
// the peers egressd's bench (tools/bench/peers.go) measures beside egressd. It is a
// bench-only tool: it has no policy, no allowlist and no per-request logging,
// and it dials nothing but loopback addresses.
//
//	goproxybare -listen 127.0.0.1:0 -ca-cert ca.pem -ca-key ca-key.pem \
//	    -mitm-hosts inject.bench.test -upstream-ca upstream-ca.pem [-resolver 127.0.0.1:53]
//
// Absolute-form HTTP requests are forwarded; a CONNECT to a host named in
// -mitm-hosts is intercepted (goproxy's ConnectMitm, leaves signed by the -ca-cert
// CA, cached per host unless -cert-cache=false); every other CONNECT is a plain
// tunnel. When the listener is bound it prints one line to stdout,
// "listening 127.0.0.1:PORT", and it exits 0 on SIGTERM or SIGINT.
//
// goproxy's defaults are pinned where they would change what is measured or
// reach outside the bench: the upstream transport ignores HTTP_PROXY and
// HTTPS_PROXY (Proxy: nil, ConnectDial: nil), verifies upstream TLS against
// -upstream-ca (goproxy's default skips verification), keeps up to
// -max-idle-per-host idle upstream connections (net/http's default of 2 makes
// 64 keep-alive clients reconnect on almost every request), and goproxy's
// built-in public CA is never used.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "goproxybare:", err)
		os.Exit(2)
	}
}

type options struct {
	listen         string
	caCert, caKey  string
	mitmHosts      map[string]bool
	upstreamCA     string
	resolver       string
	certCache      bool
	maxIdlePerHost int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("goproxybare", flag.ContinueOnError)
	var o options
	var mitm string
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "address to listen on (a loopback address)")
	fs.StringVar(&o.caCert, "ca-cert", "", "PEM certificate of the CA that signs intercepted hosts' leaves (required with -mitm-hosts)")
	fs.StringVar(&o.caKey, "ca-key", "", "PEM private key of that CA")
	fs.StringVar(&mitm, "mitm-hosts", "", "comma-separated host names whose CONNECTs are intercepted; every other CONNECT is tunnelled")
	fs.StringVar(&o.upstreamCA, "upstream-ca", "", "PEM roots for verifying upstream TLS (required)")
	fs.StringVar(&o.resolver, "resolver", "", "DNS server (IP:port) for every lookup after /etc/hosts; default: the system's")
	fs.BoolVar(&o.certCache, "cert-cache", true, "cache intercepted hosts' leaves (goproxy's CertStore); false signs a leaf per CONNECT")
	fs.IntVar(&o.maxIdlePerHost, "max-idle-per-host", 1024, "idle upstream connections kept per host")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.mitmHosts = map[string]bool{}
	for h := range strings.SplitSeq(mitm, ",") {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			o.mitmHosts[h] = true
		}
	}
	switch {
	case o.upstreamCA == "":
		return o, errors.New("-upstream-ca is required (goproxy would otherwise skip upstream TLS verification)")
	case len(o.mitmHosts) > 0 && (o.caCert == "" || o.caKey == ""):
		return o, errors.New("-mitm-hosts needs -ca-cert and -ca-key (goproxy's built-in CA is never used)")
	case o.maxIdlePerHost < 1:
		return o, errors.New("-max-idle-per-host: want at least 1")
	}
	return o, nil
}

func run(args []string, stdout io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	proxy, err := newProxy(o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if err := loopbackOnly(ln.Addr().String()); err != nil {
		ln.Close()
		return fmt.Errorf("-listen: %w", err)
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintln(stdout, "listening", ln.Addr().String())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		// Hijacked CONNECT connections are not the server's any more; the
		// bench has closed its clients by now, so close and go.
		_ = srv.Close()
		return nil
	case err := <-done:
		return err
	}
}

// newProxy is goproxy with its defaults pinned (see the package comment).
func newProxy(o options) (*goproxy.ProxyHttpServer, error) {
	roots, err := loadRoots(o.upstreamCA)
	if err != nil {
		return nil, err
	}
	dialer := &net.Dialer{
		Timeout: 10 * time.Second,
		// Refuse anything but loopback, after resolution: a bench-only tool.
		Control: func(_, address string, _ syscall.RawConn) error { return loopbackOnly(address) },
	}
	if o.resolver != "" {
		if err := loopbackOnly(o.resolver); err != nil {
			return nil, fmt.Errorf("-resolver: %w", err)
		}
		dialer.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, o.resolver)
		}}
	}
	proxy := goproxy.NewProxyHttpServer()
	proxy.Verbose = false
	// Warnings (goproxy prints some whatever Verbose says) go to stderr.
	proxy.Logger = log.New(os.Stderr, "", log.LstdFlags)
	proxy.Tr = &http.Transport{
		Proxy:               nil, // never HTTP_PROXY
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: o.maxIdlePerHost,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	// NewProxyHttpServer sets ConnectDial from HTTPS_PROXY; nil makes tunnels
	// dial with Tr.DialContext.
	proxy.ConnectDial = nil
	proxy.ConnectDialWithReq = nil

	accept := &goproxy.ConnectAction{Action: goproxy.ConnectAccept}
	var mitm *goproxy.ConnectAction
	if len(o.mitmHosts) > 0 {
		ca, err := tls.LoadX509KeyPair(o.caCert, o.caKey)
		if err != nil {
			return nil, fmt.Errorf("-ca-cert/-ca-key: %w", err)
		}
		if ca.Leaf, err = x509.ParseCertificate(ca.Certificate[0]); err != nil {
			return nil, fmt.Errorf("-ca-cert: %w", err)
		}
		if !ca.Leaf.IsCA {
			return nil, errors.New("-ca-cert is not a CA certificate")
		}
		mitm = &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(&ca)}
		if o.certCache {
			proxy.CertStore = &certStore{certs: map[string]*tls.Certificate{}}
		}
	}
	proxy.OnRequest().HandleConnectFunc(func(host string, _ *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		name := host
		if h, _, err := net.SplitHostPort(host); err == nil {
			name = h
		}
		if mitm != nil && o.mitmHosts[strings.ToLower(name)] {
			return mitm, host
		}
		return accept, host
	})
	return proxy, nil
}

func loadRoots(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-upstream-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("-upstream-ca: %s holds no PEM certificate", path)
	}
	return pool, nil
}

// loopbackOnly accepts only a loopback IP literal with a port.
func loopbackOnly(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("goproxybare dials and listens on loopback IP addresses only, not %s", addr)
	}
	return nil
}

// certStore is the smallest goproxy.CertStorage: one leaf per host name,
// generated once, kept for the life of the process.
type certStore struct {
	mu    sync.Mutex
	certs map[string]*tls.Certificate
}

func (s *certStore) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.certs[host]; ok {
		return c, nil
	}
	c, err := gen()
	if err != nil {
		return nil, err
	}
	s.certs[host] = c
	return c, nil
}
