// Package grpcecho is a gRPC service for egressd's tests, served by a real grpc-go
// server and called by a real grpc-go client: a raw-bytes codec (no generated
// code), one unary and three streaming methods that answer each message
// upper-cased, a custom trailer on every call, a status error when the first
// message is "fail", and a record of the metadata each call carried. Two more
// streaming methods serve the timing of streams (ticks.go): Ticks sends messages
// apart in time and records when each left, Acks records each message it gets.
package grpcecho

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Codec carries messages as raw bytes (*[]byte).
type Codec struct{}

func (Codec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (Codec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (Codec) Name() string { return "raw" }

// The methods, by name under ServiceName.
const (
	ServiceName  = "test.Echo"
	Unary        = "Unary"
	ServerStream = "ServerStream" // one message in, three answers
	ClientStream = "ClientStream"
	Bidi         = "Bidi"
)

// TrailerKey is the custom trailer every call ends with: "t-" + its first message.
const TrailerKey = "x-custom-trailer"

// FailMessage is the status message of a call whose first message is "fail"
// (code FailedPrecondition); it needs percent-encoding on the wire.
const FailMessage = "failed: präcondition 100%"

// Service records the metadata of every call it serves.
type Service struct {
	mu    sync.Mutex
	md    []metadata.MD
	calls map[string]*Record // by CallIDKey, for Ticks and Acks
}

// NewServer returns a grpc-go server (with opts) serving s with the raw codec.
func (s *Service) NewServer(opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(append(opts, grpc.ForceServerCodec(Codec{}))...)
	desc := grpc.ServiceDesc{ServiceName: ServiceName, HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: Unary, Handler: s.unary}}}
	for _, name := range []string{ServerStream, ClientStream, Bidi} {
		desc.Streams = append(desc.Streams, grpc.StreamDesc{StreamName: name, Handler: s.stream,
			ServerStreams: true, ClientStreams: true})
	}
	desc.Streams = append(desc.Streams,
		grpc.StreamDesc{StreamName: Ticks, Handler: s.ticks, ServerStreams: true, ClientStreams: true},
		grpc.StreamDesc{StreamName: Acks, Handler: s.acks, ServerStreams: true, ClientStreams: true})
	srv.RegisterService(&desc, nil)
	return srv
}

// Metadata returns the metadata of every call served so far.
func (s *Service) Metadata() []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metadata.MD(nil), s.md...)
}

func (s *Service) saw(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.md = append(s.md, md)
	s.mu.Unlock()
}

func end(ctx context.Context, first []byte) error {
	grpc.SetTrailer(ctx, metadata.Pairs(TrailerKey, "t-"+string(first)))
	if string(first) == "fail" {
		return status.Error(codes.FailedPrecondition, FailMessage)
	}
	return nil
}

func (s *Service) unary(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	s.saw(ctx)
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	out := []byte(strings.ToUpper(string(in)))
	return &out, end(ctx, in)
}

// stream answers every message at once (three times on ServerStream) and ends
// when the client has sent all.
func (s *Service) stream(_ any, ss grpc.ServerStream) error {
	s.saw(ss.Context())
	method, _ := grpc.Method(ss.Context())
	repeat := 1
	if strings.HasSuffix(method, "/"+ServerStream) {
		repeat = 3
	}
	var first []byte
	for i := 0; ; i++ {
		var in []byte
		err := ss.RecvMsg(&in)
		if errors.Is(err, io.EOF) {
			return end(ss.Context(), first)
		}
		if err != nil {
			return err
		}
		if i == 0 {
			first = in
		}
		out := []byte(strings.ToUpper(string(in)))
		for range repeat {
			if err := ss.SendMsg(&out); err != nil {
				return err
			}
		}
	}
}

// Call makes one call of method on cc with msgs (Unary takes the first) and
// returns the answers, the trailer and the call's error.
func Call(ctx context.Context, cc *grpc.ClientConn, method string, msgs ...string) ([]string, metadata.MD, error) {
	var tr metadata.MD
	full := "/" + ServiceName + "/" + method
	if method == Unary {
		in, out := []byte(msgs[0]), []byte(nil)
		err := cc.Invoke(ctx, full, &in, &out, grpc.Trailer(&tr), grpc.ForceCodec(Codec{}))
		if err != nil {
			return nil, tr, err
		}
		return []string{string(out)}, tr, nil
	}
	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true, ClientStreams: true}
	s, err := cc.NewStream(ctx, desc, full, grpc.ForceCodec(Codec{}))
	if err != nil {
		return nil, nil, err
	}
	got, err := exchange(s, msgs)
	return got, s.Trailer(), err
}

// exchange sends msgs on s, then reads every answer until the status.
func exchange(s grpc.ClientStream, msgs []string) ([]string, error) {
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

// Case is one call and what it must return.
type Case struct {
	Method string
	Send   []string
	Want   string // the answers, comma-joined
}

// Cases covers every call kind, with success and a status error.
var Cases = []Case{
	{Unary, []string{"hello"}, "HELLO"},
	{Unary, []string{"fail"}, ""},
	{ServerStream, []string{"s"}, "S,S,S"},
	{ClientStream, []string{"a", "b", "c"}, "A,B,C"},
	{Bidi, []string{"x", "y"}, "X,Y"},
	{Bidi, []string{"fail", "y"}, "FAIL,Y"},
}

// Check makes the call and reports what differs from the case, or "": the
// answers, the status (FailedPrecondition with FailMessage for "fail", else OK)
// and the custom trailer.
func (c Case) Check(ctx context.Context, cc *grpc.ClientConn) string {
	got, tr, err := Call(ctx, cc, c.Method, c.Send...)
	var problems []string
	want := status.New(codes.OK, "")
	if c.Send[0] == "fail" {
		want = status.New(codes.FailedPrecondition, FailMessage)
	}
	if st := status.Convert(err); st.Code() != want.Code() || st.Message() != want.Message() {
		problems = append(problems, "status "+st.String()+", want "+want.String())
	}
	if g := strings.Join(got, ","); g != c.Want {
		problems = append(problems, "answers "+g+", want "+c.Want)
	}
	if v := tr.Get(TrailerKey); len(v) != 1 || v[0] != "t-"+c.Send[0] {
		problems = append(problems, "trailer "+TrailerKey+" = "+strings.Join(v, ",")+", want t-"+c.Send[0])
	}
	return strings.Join(problems, "; ")
}
