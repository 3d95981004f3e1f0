package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/testutil/grpcecho"
)

// startGRPC serves the grpcecho service with a real grpc-go server on a public
// address of its own, as grpc.allowed.test, with a certificate egressd trusts.
func (w *world) startGRPC(t *testing.T) *grpcecho.Service {
	t.Helper()
	ip := nextPublicIP()
	ln := listenOn(t, ip+":443")
	w.DNS.Set("grpc.allowed.test", "A "+ip)
	cert := w.UpstreamPKI.Leaf(t, "grpc.allowed.test")
	svc := &grpcecho.Service{}
	srv := svc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return svc
}

// grpcClient is a grpc-go client whose every connection is a CONNECT tunnel
// through egressd, trusting egressd's CA (the tunnel is intercepted).
func (w *world) grpcClient(t *testing.T) *grpc.ClientConn {
	t.Helper()
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", w.ProxyAddr)
		if err != nil {
			return nil, err
		}
		io.WriteString(c, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			c.Close()
			return nil, errors.New("CONNECT refused")
		}
		return &replayConn{Conn: c, br: br}, nil
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: w.CAPool, ServerName: "grpc.allowed.test"})
	cc, err := grpc.NewClient("passthrough:///grpc.allowed.test:443", grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestGRPCThroughInterception: a real grpc-go client and server, every call
// kind, through an intercepted tunnel that injects a credential. grpc-status,
// grpc-message and the custom trailer reach the client; the server saw the
// injected authorization exactly, and the client's own metadata.
func TestGRPCThroughInterception(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: []allowlist.Entry{{Domain: "grpc.allowed.test", Credential: "api"}}})
	svc := w.startGRPC(t)
	cc := w.grpcClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer client-own", "x-client", "c1")
	for _, c := range grpcecho.Cases {
		t.Run(c.Method+"/"+c.Send[0], func(t *testing.T) {
			if problem := c.Check(ctx, cc); problem != "" {
				t.Error(problem)
			}
		})
	}
	mds := svc.Metadata()
	if len(mds) != len(grpcecho.Cases) {
		t.Errorf("server saw %d calls, want %d", len(mds), len(grpcecho.Cases))
	}
	for _, md := range mds {
		if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+secretToken {
			t.Errorf("server saw authorization %q, want exactly the injected one", a)
		}
		if v := md.Get("x-client"); len(v) != 1 || v[0] != "c1" {
			t.Errorf("server saw x-client %q", v)
		}
		if ua := strings.Join(md.Get("user-agent"), ","); !strings.HasPrefix(ua, "grpc-go/") {
			t.Errorf("server saw user-agent %q, want the client's own", ua)
		}
	}
	w.assertSecretNotLogged()
	w.assertNoCanaryHit()
}
