// Command echo-upstream is a demo origin for egressd: it answers every request
// with JSON describing what it received (method, host, path, protocol, every
// header, body length), so you can see what egressd injected on the way out.
// It serves HTTPS with a throwaway CA it makes at start (written to -ca-out, for
// egressd's tls.upstream_ca_file) and, optionally, plain HTTP.
//
//	go run ./examples/echo-upstream -addr 127.0.0.1:8443 -ca-out /tmp/echo-ca.pem [-http-addr 127.0.0.1:8080]
//
// It echoes every header, secrets included, so it listens on loopback only.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

const (
	// maxBody bounds how much of a request body is read (and counted).
	maxBody = 16 << 20
	// validity of the throwaway CA and leaf: one demo session.
	validity = 7 * 24 * time.Hour
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "echo-upstream:", err)
		}
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("echo-upstream", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8443", "HTTPS listen address (loopback only)")
	httpAddr := fs.String("http-addr", "", "plain HTTP listen address (loopback only); empty: no plain HTTP")
	caOut := fs.String("ca-out", filepath.Join(os.TempDir(), "echo-ca.pem"), "where to write the CA certificate (PEM) that signed the HTTPS leaf")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, a := range []string{*addr, *httpAddr} {
		if a != "" {
			if err := loopbackOnly(a); err != nil {
				return err
			}
		}
	}

	caPEM, leaf, err := newPKI()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*caOut, caPEM, 0o644); err != nil {
		return fmt.Errorf("-ca-out: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tlsLn, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	servers := []*http.Server{newServer(&tls.Config{
		Certificates: []tls.Certificate{leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})}
	errs := make(chan error, 2)
	go func() { errs <- servers[0].ServeTLS(tlsLn, "", "") }()
	log.Printf("echo-upstream: https://%s/ (leaf for localhost, 127.0.0.1, ::1; CA in %s)", tlsLn.Addr(), *caOut)
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			servers[0].Close()
			return err
		}
		servers = append(servers, newServer(nil))
		go func() { errs <- servers[1].Serve(ln) }()
		log.Printf("echo-upstream: http://%s/", ln.Addr())
	}

	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdown)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func newServer(tlsConf *tls.Config) *http.Server {
	return &http.Server{
		Handler:           http.HandlerFunc(echo),
		TLSConfig:         tlsConf,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
}

// received is what echo answers with.
type received struct {
	Method    string              `json:"method"`
	Host      string              `json:"host"`
	Path      string              `json:"path"`
	Query     string              `json:"query,omitempty"`
	Proto     string              `json:"proto"`
	TLS       bool                `json:"tls"`
	SNI       string              `json:"sni,omitempty"`
	Headers   map[string][]string `json:"headers"` // every header, as received (keys sorted in the JSON)
	Trailers  map[string][]string `json:"trailers,omitempty"`
	BodyBytes int64               `json:"body_bytes"`
	BodyError string              `json:"body_error,omitempty"`
}

// echo answers with the request it received, as indented JSON, and prints the same
// JSON on its own stdout: through egressd the client's copy has every injected value
// masked (egressd scrubs what it injected out of responses), the terminal's has them.
func echo(w http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxBody))
	rec := received{
		Method:    r.Method,
		Host:      r.Host,
		Path:      r.URL.Path,
		Query:     r.URL.RawQuery,
		Proto:     r.Proto,
		TLS:       r.TLS != nil,
		Headers:   r.Header,
		BodyBytes: n,
	}
	if r.TLS != nil {
		rec.SNI = r.TLS.ServerName
	}
	if len(r.Trailer) > 0 {
		rec.Trailers = r.Trailer
	}
	if err != nil {
		rec.BodyError = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(io.MultiWriter(w, os.Stdout))
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(rec)
}

// newPKI makes a throwaway CA (returned as PEM) and a leaf it signs for
// localhost, 127.0.0.1 and ::1, both ECDSA P-256. The keys never leave memory.
func newPKI() ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "egressd echo-upstream demo CA (throwaway)"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	leaf := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), leaf, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

// loopbackOnly refuses listen addresses that are not a loopback IP literal:
// the echo hands back every header it receives, injected secrets included.
func loopbackOnly(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() {
		return fmt.Errorf("%q: listen on a loopback IP literal and port, e.g. 127.0.0.1:8443 (the echo shows every header, secrets included)", addr)
	}
	return nil
}
