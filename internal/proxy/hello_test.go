package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// The ClientHello rules of spliced tunnels: a spliced tunnel is never read again,
// so what its ClientHello could name beyond the SNI egressd checked must be refused
// or brought under interception.

// TestSplicedTunnelWithoutSNI: a named CONNECT target whose ClientHello carries no
// SNI could be served any name by the far end; it is refused with host_mismatch /
// no_sni and the upstream never sees a handshake.
func TestSplicedTunnelWithoutSNI(t *testing.T) {
	w := newWorld(t, worldOpts{})
	before := w.Upstream.requests.Load()
	// IP-address ServerName: crypto/tls sends no SNI extension.
	tc := tls.Client(w.connect(t, "www.allowed.test:443"), &tls.Config{ServerName: w.PublicIP, RootCAs: w.UpstreamCA})
	err := tc.HandshakeContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("handshake without SNI in a spliced tunnel: %v, want alert unrecognized_name", err)
	}
	line := w.waitLog(t, func(l map[string]any) bool { return l["reason"] == "host_mismatch" })
	if line["detail"] != "no_sni" || line["decision"] != "deny" {
		t.Errorf("log line %v, want deny host_mismatch/no_sni", line)
	}
	if w.Upstream.requests.Load() != before {
		t.Error("the upstream saw a request")
	}
}

// TestSplicedTunnelToIPWithoutSNI: an IP target has no name to send, so no SNI is
// what every client sends; it is spliced.
func TestSplicedTunnelToIPWithoutSNI(t *testing.T) {
	w := newWorld(t, worldOpts{allowlist: []allowlist.Entry{{Domain: "*"}}})
	c := w.interceptingClient()
	resp, err := c.Get("https://" + w.PublicIP + "/ip")
	if err != nil {
		t.Fatal(err)
	}
	decodeEcho(t, resp)
}

// TestEncryptedClientHello: a real ECH client whose outer SNI names the allowlisted
// www.allowed.test and whose inner hello names other.test, a tenant of the same
// edge that the allowlist does not name. Spliced, the edge would decrypt the inner
// hello and serve other.test. Where egressd's CA is trusted the tunnel is
// intercepted instead (the ECH is not accepted; the client sees egressd's leaf for
// the outer name); under tls.intercept: none it is refused with host_mismatch/ech.
func TestEncryptedClientHello(t *testing.T) {
	for _, mode := range []allowlist.InterceptMode{allowlist.InterceptAuto, allowlist.InterceptNone} {
		t.Run(string(mode), func(t *testing.T) {
			w := newWorld(t, worldOpts{intercept: mode})
			edge := w.startECHEdge(t)
			pool := w.CAPool.Clone()
			pool.AppendCertsFromPEM(w.upstreamCAPEM)
			tc := tls.Client(w.connect(t, "www.allowed.test:443"), &tls.Config{
				ServerName: "other.test", RootCAs: pool, MinVersion: tls.VersionTLS13,
				EncryptedClientHelloConfigList: edge.configList,
			})
			err := tc.HandshakeContext(context.Background())
			if err == nil {
				t.Fatalf("handshake succeeded with %s's certificate: the inner name was served",
					tc.ConnectionState().PeerCertificates[0].Subject)
			}
			var rejected *tls.ECHRejectionError
			switch mode {
			case allowlist.InterceptAuto:
				if !errors.As(err, &rejected) {
					t.Fatalf("handshake: %v, want the ECH rejected by egressd's interception", err)
				}
			default:
				if !strings.Contains(err.Error(), "unrecognized name") {
					t.Fatalf("handshake: %v, want alert unrecognized_name", err)
				}
				line := w.waitLog(t, func(l map[string]any) bool { return l["reason"] == "host_mismatch" })
				if line["detail"] != "ech" {
					t.Errorf("log detail %v, want ech", line["detail"])
				}
			}
			if n := edge.handshakes.Load(); n != 0 {
				t.Errorf("the edge saw %d handshakes", n)
			}
		})
	}
}

// echEdge is a TLS server that accepts ECH for its public name, as a CDN edge does.
type echEdge struct {
	ip         string
	configList []byte
	handshakes *atomic.Int64 // ClientHellos the edge read
}

// startECHEdge replaces the world's HTTPS upstream for www.allowed.test with an ECH
// edge on a new address; it serves both the public name and other.test.
func (w *world) startECHEdge(t *testing.T) echEdge {
	t.Helper()
	ip := nextPublicIP()
	w.DNS.Set("www.allowed.test", "A "+ip)
	ech := testpki.NewECH(t, "www.allowed.test")
	hellos := &atomic.Int64{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.WriteString(rw, "edge")
	}))
	srv.Listener.Close()
	srv.Listener = listenOn(t, ip+":443")
	srv.TLS = &tls.Config{
		Certificates:             []tls.Certificate{w.UpstreamPKI.Leaf(t, "www.allowed.test", "other.test")},
		EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{ech.Key},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			hellos.Add(1)
			return nil, nil
		},
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return echEdge{ip: ip, configList: ech.ConfigList, handshakes: hellos}
}

// TestEncryptedClientHelloTransparent: the same rule on the transparent listener,
// where the ClientHello arrives before any decision.
func TestEncryptedClientHelloTransparent(t *testing.T) {
	w := newWorld(t, worldOpts{intercept: allowlist.InterceptNone})
	sb := w.serveTransparent(t)
	edge := w.startECHEdge(t)
	c, err := sb.dial(t, "tcp", edge.ip+":443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: "other.test", RootCAs: w.UpstreamCA,
		MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: edge.configList})
	if err := tc.Handshake(); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("handshake: %v, want alert unrecognized_name", err)
	}
	line := w.waitLog(t, func(l map[string]any) bool { return l["reason"] == "host_mismatch" })
	if line["detail"] != "ech" || line["host"] != "www.allowed.test" {
		t.Errorf("log line %v, want host_mismatch/ech for www.allowed.test", line)
	}
	if n := edge.handshakes.Load(); n != 0 {
		t.Errorf("the edge saw %d ClientHellos", n)
	}
}
