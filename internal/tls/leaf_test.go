package mitm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCA generates an in-memory CA valid for validity from now.
func testCA(t testing.TB, validity time.Duration) *CA {
	t.Helper()
	ca, _, err := newCA("test", time.Now(), validity)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (ca *CA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func verifyLeaf(t *testing.T, ca *CA, leaf *x509.Certificate, host string) {
	t.Helper()
	_, err := leaf.Verify(x509.VerifyOptions{
		DNSName:   host,
		Roots:     ca.pool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		t.Errorf("leaf for %s does not verify: %v", host, err)
	}
}

// fakeClock is a settable Leaves.now.
type fakeClock struct{ t atomic.Pointer[time.Time] }

func (c *fakeClock) now() time.Time          { return *c.t.Load() }
func (c *fakeClock) set(t time.Time)         { c.t.Store(&t) }
func (c *fakeClock) advance(d time.Duration) { c.set(c.now().Add(d)) }

func TestLeafDNS(t *testing.T) {
	ca := testCA(t, caValidity)
	l := NewLeaves(ca, LeafOptions{})
	cert, err := l.Get("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		t.Fatal("tls.Certificate.Leaf not set")
	}
	verifyLeaf(t, ca, leaf, "api.example.com")
	if !slices.Equal(leaf.DNSNames, []string{"api.example.com"}) || len(leaf.IPAddresses) != 0 || len(leaf.URIs) != 0 || len(leaf.EmailAddresses) != 0 {
		t.Errorf("SANs: DNS %v IP %v", leaf.DNSNames, leaf.IPAddresses)
	}
	if leaf.Subject.CommonName != "api.example.com" {
		t.Errorf("CommonName %q", leaf.Subject.CommonName)
	}
	for _, other := range []string{"example.com", "x.api.example.com", "api.example.org"} {
		if leaf.VerifyHostname(other) == nil {
			t.Errorf("leaf for api.example.com also valid for %s", other)
		}
	}
	if leaf.IsCA || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("IsCA %v ExtKeyUsage %v", leaf.IsCA, leaf.ExtKeyUsage)
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("leaf key %T, want ECDSA P-256", leaf.PublicKey)
	}
	priv, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !priv.PublicKey.Equal(pub) {
		t.Error("PrivateKey does not match the leaf")
	}
	if priv.PublicKey.Equal(ca.Key.Public()) {
		t.Error("leaf reuses the CA key")
	}
	if len(cert.Certificate) != 2 || !bytes.Equal(cert.Certificate[0], leaf.Raw) || !bytes.Equal(cert.Certificate[1], ca.Cert.Raw) {
		t.Error("chain is not [leaf, CA]")
	}
	now := time.Now()
	if d := now.Sub(leaf.NotBefore); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("NotBefore %v is not an hour ago", leaf.NotBefore)
	}
	if d := leaf.NotAfter.Sub(now); d < DefaultLeafValidity-time.Minute || d > DefaultLeafValidity {
		t.Errorf("NotAfter %v is not DefaultLeafValidity ahead", leaf.NotAfter)
	}

	other, err := l.Get("b.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if other.PrivateKey.(*ecdsa.PrivateKey).Equal(priv) || other.Leaf.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Error("two leaves share a key or serial")
	}
}

func TestLeafIP(t *testing.T) {
	ca := testCA(t, caValidity)
	l := NewLeaves(ca, LeafOptions{})
	for _, host := range []string{"203.0.113.7", "2001:db8::1"} {
		cert, err := l.Get(host)
		if err != nil {
			t.Fatal(err)
		}
		leaf := cert.Leaf
		if len(leaf.IPAddresses) != 1 || len(leaf.DNSNames) != 0 {
			t.Fatalf("%s: SANs DNS %v IP %v", host, leaf.DNSNames, leaf.IPAddresses)
		}
		if got, _ := netip.AddrFromSlice(leaf.IPAddresses[0]); got.Unmap() != netip.MustParseAddr(host) {
			t.Errorf("%s: IP SAN %v", host, leaf.IPAddresses[0])
		}
		verifyLeaf(t, ca, leaf, host)
	}
}

func TestLeafRejectsNonHosts(t *testing.T) {
	l := NewLeaves(testCA(t, caValidity), LeafOptions{})
	for _, host := range []string{"", "a..b", ".example.com", "example.com:443", "*.example.com", "[::1]", "fe80::1%eth0", "exa mple.com", "a/b"} {
		if _, err := l.Get(host); err == nil {
			t.Errorf("Get(%q) minted a leaf", host)
		}
	}
}

func TestLeafValidityCappedByCA(t *testing.T) {
	ca := testCA(t, 2*time.Hour)
	clock := &fakeClock{}
	clock.set(time.Now())
	l := NewLeaves(ca, LeafOptions{})
	l.now = clock.now
	cert, err := l.Get("example.com")
	if err != nil {
		t.Fatal(err)
	}
	if !cert.Leaf.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("leaf NotAfter %v, CA NotAfter %v", cert.Leaf.NotAfter, ca.Cert.NotAfter)
	}
	verifyLeaf(t, ca, cert.Leaf, "example.com")

	// Within the refresh window of the CA's own expiry, re-minting cannot do
	// better: the cached leaf is still served.
	clock.set(ca.Cert.NotAfter.Add(-30 * time.Minute))
	if again, _ := l.Get("example.com"); again != cert {
		t.Error("leaf re-minted although it already runs to the CA's expiry")
	}
	// Past the CA's expiry nothing can be minted.
	clock.set(ca.Cert.NotAfter.Add(time.Second))
	if _, err := l.Get("example.com"); err == nil {
		t.Error("minted a leaf with an expired CA")
	}
	if got := l.mints.Load(); got != 2 {
		t.Errorf("%d mints, want 2", got)
	}
}

func TestLeafCacheHitAndLRU(t *testing.T) {
	var hits, misses atomic.Int64
	l := NewLeaves(testCA(t, caValidity), LeafOptions{CacheSize: 2, OnLookup: func(hit bool) {
		if hit {
			hits.Add(1)
		} else {
			misses.Add(1)
		}
	}})
	get := func(host string) *tls.Certificate {
		t.Helper()
		c, err := l.Get(host)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := get("a.test")
	if get("a.test") != a {
		t.Fatal("cache hit returned another certificate")
	}
	if hits.Load() != 1 || misses.Load() != 1 {
		t.Errorf("hits %d misses %d, want 1 1", hits.Load(), misses.Load())
	}
	b := get("b.test")
	get("a.test")      // a is now the most recently used
	c := get("c.test") // evicts b
	if l.lru.Len() != 2 || len(l.byHost) != 2 {
		t.Fatalf("cache holds %d/%d entries, want 2", l.lru.Len(), len(l.byHost))
	}
	if get("a.test") != a || get("c.test") != c {
		t.Error("a recently used leaf was evicted")
	}
	mints := l.mints.Load()
	if get("b.test") == b || l.mints.Load() != mints+1 {
		t.Error("the least recently used leaf was not evicted")
	}
}

func TestLeafNearExpiryIsReminted(t *testing.T) {
	clock := &fakeClock{}
	clock.set(time.Now().Truncate(time.Second)) // certificates hold whole seconds
	// Validity 8s: the refresh window is 8s/4 = 2s.
	l := NewLeaves(testCA(t, caValidity), LeafOptions{Validity: 8 * time.Second})
	l.now = clock.now
	first, err := l.Get("example.com")
	if err != nil {
		t.Fatal(err)
	}
	clock.advance(5 * time.Second) // 3s left: still served
	if again, _ := l.Get("example.com"); again != first {
		t.Fatal("leaf with 3s left of 8s was re-minted")
	}
	clock.advance(1500 * time.Millisecond) // 1.5s left: inside the window
	fresh, err := l.Get("example.com")
	if err != nil {
		t.Fatal(err)
	}
	if fresh == first || !fresh.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatal("near-expiry leaf was not re-minted")
	}
	if again, _ := l.Get("example.com"); again != fresh {
		t.Error("the re-minted leaf was not cached")
	}
	if l.lru.Len() != 1 {
		t.Errorf("re-minting left %d entries", l.lru.Len())
	}
}

func TestLeafDefaults(t *testing.T) {
	l := NewLeaves(testCA(t, caValidity), LeafOptions{})
	if l.validity != DefaultLeafValidity || l.size != DefaultLeafCacheSize || cap(l.sem) != DefaultMintConcurrency || l.refresh != time.Hour {
		t.Errorf("defaults: validity %v size %d mint %d refresh %v", l.validity, l.size, cap(l.sem), l.refresh)
	}
	l = NewLeaves(l.ca, LeafOptions{Validity: time.Hour, CacheSize: 3, MintConcurrency: 9})
	if l.validity != time.Hour || l.size != 3 || cap(l.sem) != 9 || l.refresh != 15*time.Minute {
		t.Errorf("options: validity %v size %d mint %d refresh %v", l.validity, l.size, cap(l.sem), l.refresh)
	}
}

func TestLeafConcurrentGetsMintOnce(t *testing.T) {
	var misses atomic.Int64
	l := NewLeaves(testCA(t, caValidity), LeafOptions{OnLookup: func(hit bool) {
		if !hit {
			misses.Add(1)
		}
	}})
	const n = 50
	certs := make([]*tls.Certificate, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			c, err := l.Get("new.example.com")
			if err != nil {
				t.Error(err)
			}
			certs[i] = c
		})
	}
	close(start)
	wg.Wait()
	if got := l.mints.Load(); got != 1 {
		t.Errorf("%d mints, want 1", got)
	}
	if got := misses.Load(); got != 1 {
		t.Errorf("%d misses reported, want 1", got)
	}
	for i, c := range certs {
		if c != certs[0] {
			t.Fatalf("goroutine %d got another certificate", i)
		}
	}
	if len(l.flight) != 0 {
		t.Errorf("%d mints still in flight", len(l.flight))
	}
}

func TestLeafMintConcurrencyBound(t *testing.T) {
	l := NewLeaves(testCA(t, caValidity), LeafOptions{MintConcurrency: 2})
	// Hold both slots: a Get for a new host must wait, and proceed once one frees.
	l.sem <- struct{}{}
	l.sem <- struct{}{}
	done := make(chan error)
	go func() { _, err := l.Get("queued.test"); done <- err }()
	select {
	case <-done:
		t.Fatal("minted without a free slot")
	case <-time.After(50 * time.Millisecond):
	}
	<-l.sem
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestServerConfigIgnoresSNI(t *testing.T) {
	l := NewLeaves(testCA(t, caValidity), LeafOptions{})
	protos := []string{"h2", "http/1.1"}
	for _, warm := range []bool{false, true} {
		cfg := l.ServerConfig("api.example.com", protos)
		if cfg.MinVersion != tls.VersionTLS12 || !slices.Equal(cfg.NextProtos, protos) {
			t.Errorf("MinVersion %x NextProtos %v", cfg.MinVersion, cfg.NextProtos)
		}
		for _, sni := range []string{"api.example.com", "evil.test", ""} {
			got, err := cfg.GetCertificate(&tls.ClientHelloInfo{ServerName: sni})
			if err != nil {
				t.Fatal(err)
			}
			want, _ := l.Get("api.example.com")
			if got != want {
				t.Errorf("warm=%v SNI %q: not api.example.com's leaf (%v)", warm, sni, got.Leaf.DNSNames)
			}
		}
	}
}

func TestServerConfigAllocatesOnlyTheConfig(t *testing.T) {
	l := NewLeaves(testCA(t, caValidity), LeafOptions{})
	if _, err := l.Get("api.example.com"); err != nil {
		t.Fatal(err)
	}
	protos := []string{"h2", "http/1.1"}
	if n := testing.AllocsPerRun(100, func() { configSink = l.ServerConfig("api.example.com", protos) }); n != 1 {
		t.Errorf("ServerConfig for a cached host: %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { configSink = l.ServerConfig("new.example.com", protos) }); n != 4 {
		t.Errorf("ServerConfig for a new host: %v allocations, want 4 (config, three host-bound closures)", n)
	}
	if l.mints.Load() != 1 {
		t.Error("ServerConfig minted a leaf")
	}
}

// configSink makes ServerConfig's result escape, as it does in the proxy.
var configSink *tls.Config

// handshake runs a TLS handshake over loopback TCP between a server using cfg
// and a client using client, and returns the client's view.
func handshake(t testing.TB, cfg *tls.Config, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		srv := tls.Server(c, cfg)
		if srv.Handshake() == nil {
			srv.Write([]byte("x")) // so the client completes a TLS 1.3 read
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, client)
	if err := tc.Handshake(); err != nil {
		return tls.ConnectionState{}, err
	}
	if _, err := tc.Read(make([]byte, 1)); err != nil {
		return tls.ConnectionState{}, err
	}
	return tc.ConnectionState(), nil
}

func TestHandshake(t *testing.T) {
	ca := testCA(t, caValidity)
	l := NewLeaves(ca, LeafOptions{})
	tests := []struct {
		name      string
		host      string // egressd's decided host
		client    *tls.Config
		wantErr   string // substring of the client's error
		wantProto string
	}{
		{name: "h2 offered", host: "api.example.com", client: &tls.Config{ServerName: "api.example.com", NextProtos: []string{"h2", "http/1.1"}}, wantProto: "h2"},
		{name: "http/1.1 only", host: "api.example.com", client: &tls.Config{ServerName: "api.example.com", NextProtos: []string{"http/1.1"}}, wantProto: "http/1.1"},
		{name: "no ALPN", host: "api.example.com", client: &tls.Config{ServerName: "api.example.com"}},
		{name: "IP literal", host: "203.0.113.7", client: &tls.Config{ServerName: "203.0.113.7"}},
		{name: "SNI names another host", host: "api.example.com", client: &tls.Config{ServerName: "evil.test"}, wantErr: "not evil.test"},
		{name: "TLS 1.1 refused", host: "api.example.com", client: &tls.Config{ServerName: "api.example.com", MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, wantErr: "protocol version"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.client.RootCAs = ca.pool()
			st, err := handshake(t, l.ServerConfig(tc.host, []string{"h2", "http/1.1"}), tc.client)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.NegotiatedProtocol != tc.wantProto {
				t.Errorf("ALPN %q, want %q", st.NegotiatedProtocol, tc.wantProto)
			}
			if leaf := st.PeerCertificates[0]; leaf.Subject.CommonName != tc.host || len(st.PeerCertificates) != 2 {
				t.Errorf("peer chain: %d certs, leaf %q", len(st.PeerCertificates), leaf.Subject.CommonName)
			}
		})
	}
}

func BenchmarkLeafHit(b *testing.B) {
	l := NewLeaves(testCA(b, caValidity), LeafOptions{})
	if _, err := l.Get("api.example.com"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Get("api.example.com"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLeafMiss(b *testing.B) {
	l := NewLeaves(testCA(b, caValidity), LeafOptions{})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := l.Get(fmt.Sprintf("h%d.example.com", i)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServerConfig(b *testing.B) {
	l := NewLeaves(testCA(b, caValidity), LeafOptions{})
	if _, err := l.Get("api.example.com"); err != nil {
		b.Fatal(err)
	}
	protos := []string{"h2", "http/1.1"}
	b.ReportAllocs()
	for b.Loop() {
		configSink = l.ServerConfig("api.example.com", protos)
	}
}
