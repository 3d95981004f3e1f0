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
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/egressd/egressd/internal/allowlist"
)

// rawCodec carries messages as raw bytes, so the test needs no generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// grpcServer is a real grpc-go server behind egressd: each method answers with
// its messages upper-cased, sets a custom trailer, records the metadata it saw,
// and fails with a status when the first message is "fail".
type grpcServer struct {
	mu  sync.Mutex
	md  []metadata.MD
	srv *grpc.Server
}

func (g *grpcServer) saw(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	g.mu.Lock()
	g.md = append(g.md, md)
	g.mu.Unlock()
}

func (g *grpcServer) answer(ctx context.Context, first []byte) error {
	grpc.SetTrailer(ctx, metadata.Pairs("x-custom-trailer", "t-"+string(first)))
	if string(first) == "fail" {
		return status.Error(codes.FailedPrecondition, "failed: präcondition 100%")
	}
	return nil
}

func (g *grpcServer) unary(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	g.saw(ctx)
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	out := []byte(strings.ToUpper(string(in)))
	return &out, g.answer(ctx, in)
}

// stream receives every message the client sends and answers each at once
// (client-, server- and bidi-streaming share it: the server-streaming method gets
// one message and answers three times).
func (g *grpcServer) stream(_ any, ss grpc.ServerStream) error {
	g.saw(ss.Context())
	var first []byte
	for i := 0; ; i++ {
		var in []byte
		err := ss.RecvMsg(&in)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if i == 0 {
			first = in
		}
		out := []byte(strings.ToUpper(string(in)))
		repeat := 1
		if strings.HasSuffix(grpcMethod(ss), "ServerStream") {
			repeat = 3
		}
		for range repeat {
			if err := ss.SendMsg(&out); err != nil {
				return err
			}
		}
	}
	return g.answer(ss.Context(), first)
}

func grpcMethod(ss grpc.ServerStream) string {
	m, _ := grpc.Method(ss.Context())
	return m
}

var grpcDesc = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Unary", Handler: nil}},
	Streams: []grpc.StreamDesc{
		{StreamName: "ServerStream", ServerStreams: true},
		{StreamName: "ClientStream", ClientStreams: true},
		{StreamName: "Bidi", ServerStreams: true, ClientStreams: true},
	},
}

// startGRPC serves the test service on a public address of its own, as
// grpc.allowed.test, with a certificate egressd trusts.
func (w *world) startGRPC(t *testing.T) *grpcServer {
	t.Helper()
	ip := nextPublicIP()
	ln := listenOn(t, ip+":443")
	w.DNS.Set("grpc.allowed.test", "A "+ip)
	cert := w.UpstreamPKI.Leaf(t, "grpc.allowed.test")
	g := &grpcServer{}
	desc := grpcDesc
	desc.Methods = []grpc.MethodDesc{{MethodName: "Unary", Handler: g.unary}}
	desc.Streams = append([]grpc.StreamDesc(nil), grpcDesc.Streams...)
	for i := range desc.Streams {
		desc.Streams[i].Handler = g.stream
	}
	g.srv = grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)), grpc.ForceServerCodec(rawCodec{}))
	g.srv.RegisterService(&desc, nil)
	go g.srv.Serve(ln)
	t.Cleanup(g.srv.Stop)
	return g
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
		grpc.WithContextDialer(dial), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
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
	g := w.startGRPC(t)
	cc := w.grpcClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer client-own", "x-client", "c1")

	t.Run("unary", func(t *testing.T) {
		var out []byte
		var tr metadata.MD
		in := []byte("hello")
		if err := cc.Invoke(ctx, "/test.Echo/Unary", &in, &out, grpc.Trailer(&tr)); err != nil {
			t.Fatal(err)
		}
		if string(out) != "HELLO" || first(tr, "x-custom-trailer") != "t-hello" {
			t.Errorf("got %q, trailers %v", out, tr)
		}
	})
	t.Run("unary error status", func(t *testing.T) {
		var out []byte
		var tr metadata.MD
		in := []byte("fail")
		err := cc.Invoke(ctx, "/test.Echo/Unary", &in, &out, grpc.Trailer(&tr))
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "failed: präcondition 100%" {
			t.Errorf("status %v", err)
		}
		if first(tr, "x-custom-trailer") != "t-fail" {
			t.Errorf("trailers %v", tr)
		}
	})
	for _, tc := range []struct {
		method string
		send   []string
		want   string
	}{
		{"ServerStream", []string{"s"}, "S,S,S"},
		{"ClientStream", []string{"a", "b", "c"}, "A,B,C"},
		{"Bidi", []string{"x", "y"}, "X,Y"},
		{"Bidi", []string{"fail", "y"}, "FAIL,Y"},
	} {
		t.Run(tc.method+"/"+tc.send[0], func(t *testing.T) {
			desc := &grpc.StreamDesc{StreamName: tc.method, ServerStreams: true, ClientStreams: true}
			s, err := cc.NewStream(ctx, desc, "/test.Echo/"+tc.method)
			if err != nil {
				t.Fatal(err)
			}
			got, err := exchangeStream(s, tc.send)
			wantCode := codes.OK
			if tc.send[0] == "fail" {
				wantCode = codes.FailedPrecondition
			}
			if status.Code(err) != wantCode || strings.Join(got, ",") != tc.want {
				t.Errorf("got %q, %v; want %q, %v", got, err, tc.want, wantCode)
			}
			if tr := s.Trailer(); first(tr, "x-custom-trailer") != "t-"+tc.send[0] {
				t.Errorf("trailers %v", tr)
			}
		})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.md) != 6 {
		t.Errorf("server saw %d calls, want 6", len(g.md))
	}
	for _, md := range g.md {
		if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+secretToken {
			t.Errorf("server saw authorization %q, want exactly the injected one", a)
		}
		if md.Get("x-client")[0] != "c1" {
			t.Errorf("server saw x-client %q", md.Get("x-client"))
		}
	}
	w.assertSecretNotLogged()
	w.assertNoCanaryHit()
}

// exchangeStream sends msgs on s, then reads every answer until the status.
func exchangeStream(s grpc.ClientStream, msgs []string) ([]string, error) {
	for _, m := range msgs {
		b := []byte(m)
		if err := s.SendMsg(&b); err != nil {
			return nil, err
		}
	}
	if err := s.CloseSend(); err != nil {
		return nil, err
	}
	var got []string
	for {
		var b []byte
		err := s.RecvMsg(&b)
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, string(b))
	}
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
