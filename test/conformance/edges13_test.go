package conformance_test

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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/egressd/egressd/internal/testutil/grpcecho"
)

// TestProtocolEdges: an h2c offer is declined, never switched: the request is
// served over HTTP/1.1 without the offer, and an optimistic client's preface is then
// read as a malformed HTTP/1 request that ends the connection, so the request sent
// after it is never served. An upstream cannot fake egressd's own fields.
func TestProtocolEdges(t *testing.T) {
	w := newWorld(t, config{})
	upgrades := map[string]string{
		"h2c with HTTP2-Settings": "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
		"h2c in an Upgrade list":  "Connection: Upgrade\r\nUpgrade: websocket, H2C\r\n",
		"h2c without Connection":  "Upgrade: h2c\r\n",
	}
	for _, where := range []string{"intercepted", "explicit"} {
		for name, hdr := range upgrades {
			t.Run(where+"/"+name, func(t *testing.T) {
				k := w.begin(t)
				c, target, host := k.headerConn(where)
				k.send(c, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\n"+hdr+"\r\n"+
					"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"+"GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				resp := k.response(c, http.MethodGet)
				if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 1 {
					t.Fatalf("h2c offer answered %s %s, want 200 over HTTP/1.1", resp.Proto, resp.Status)
				}
				io.Copy(io.Discard, resp.Body)
				k.assertClosed(c, 3*time.Second)
				got := k.assertUpstreamSaw(1)[0]
				if u := got.Header.Get("Upgrade"); strings.Contains(strings.ToLower(u), "h2c") || got.Header.Get("Http2-Settings") != "" {
					t.Errorf("the upstream got the h2c offer: %v", got.Header)
				}
			})
		}
		t.Run(where+"/upstream Egressd-* headers and trailers are removed", func(t *testing.T) {
			k := w.begin(t)
			c, target, host := k.headerConn(where)
			k.send(c, "GET "+target+"?forge=1 HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
			resp := k.response(c, http.MethodGet)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			for _, h := range []http.Header{resp.Header, resp.Trailer} {
				for name := range h {
					if strings.HasPrefix(strings.ToLower(name), "egressd-") {
						t.Errorf("client saw the upstream's %s", name)
					}
				}
			}
			if resp.Trailer.Get("X-Undeclared") != "kept" {
				t.Errorf("trailers %v, want X-Undeclared", resp.Trailer)
			}
			k.assertUpstreamSaw(1)
		})
	}
}

// TestGRPCIntercepted: a real grpc-go client calls, through an intercepted tunnel
// that injects the credential, a grpc-go service behind the echo upstream: every
// call kind succeeds (or fails with its status), grpc-status, grpc-message and the
// custom trailer arrive, and the service saw exactly the injected authorization.
func TestGRPCIntercepted(t *testing.T) {
	w := newWorld(t, config{})
	k := w.begin(t)
	svc := k.w.fx.echo.grpcSvc
	before := len(svc.Metadata())
	cc := k.grpcClient("api.allowed.test")
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer client-own")
	for _, c := range grpcecho.Cases {
		if problem := c.Check(ctx, cc); problem != "" {
			t.Errorf("%s %q: %s", c.Method, c.Send, problem)
		}
	}
	mds := svc.Metadata()[before:]
	if len(mds) != len(grpcecho.Cases) {
		t.Errorf("the service saw %d calls, want %d", len(mds), len(grpcecho.Cases))
	}
	for _, md := range mds {
		if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+secret {
			t.Errorf("the service saw %d authorization value(s), want exactly the injected one", len(a))
		}
	}
}

// grpcClient is a grpc-go client whose connections are CONNECT tunnels to host
// through egressd, trusting egressd's CA.
func (k *kase) grpcClient(host string) *grpc.ClientConn {
	k.t.Helper()
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", k.w.ProxyAddr)
		if err != nil {
			return nil, err
		}
		io.WriteString(nc, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		br := bufio.NewReader(nc)
		if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
			nc.Close()
			return nil, errors.New("CONNECT refused")
		}
		return &conn{Conn: nc, br: br}, nil
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: k.w.roots, ServerName: host})
	cc, err := grpc.NewClient("passthrough:///"+host+":443", grpc.WithTransportCredentials(creds), grpc.WithContextDialer(dial))
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { cc.Close() })
	return cc
}

// TestGRPCRefusalReadable: a gRPC call egressd refuses is answered as a gRPC status a
// grpc-go client shows: PERMISSION_DENIED (and the reason in the message) for a
// denial inside a tunnel egressd accepted only to say why, UNAVAILABLE for a failure;
// never "unexpected content-type application/json".
func TestGRPCRefusalReadable(t *testing.T) {
	w := newWorld(t, config{denyInTunnel: "always"})
	k := w.begin(t)
	cc := k.grpcClient("evil.test")
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	msg := []byte("hello")
	var out []byte
	err := cc.Invoke(ctx, "/"+grpcecho.ServiceName+"/"+grpcecho.Unary, &msg, &out, grpc.ForceCodec(grpcecho.Codec{}))
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "not_allowlisted") {
		t.Errorf("refused call: %v, want PermissionDenied naming not_allowlisted", err)
	}
	// The connection stays: a second call on it is refused the same way.
	err = cc.Invoke(ctx, "/"+grpcecho.ServiceName+"/"+grpcecho.Unary, &msg, &out, grpc.ForceCodec(grpcecho.Codec{}))
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied {
		t.Errorf("second refused call: %v", err)
	}
	k.assertUpstreamSaw(0)
}
