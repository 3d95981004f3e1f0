// Command grpcclient is the grpc-go client of the real-client suite (test/clients):
// a program like any grpc-go user's, dialling its target with grpc-go's defaults
// (HTTPS_PROXY from the environment, the system roots, which SSL_CERT_FILE names,
// DNS from /etc/resolv.conf), running one scenario against the service of
// internal/testutil/grpcecho and printing what it saw as JSON lines: each message
// with the time it was read, then the call's status as status.Code and
// status.Message show it.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/egressd/egressd/internal/testutil/grpcecho"
)

var (
	target   = flag.String("target", "", "host:port to dial")
	scenario = flag.String("scenario", "unary", "cases | unary | ticks | acks")
	callID   = flag.String("call-id", "", "sent as "+grpcecho.CallIDKey+" metadata")
	token    = flag.String("token", "", "sent as authorization: Bearer <token> metadata, or as -token-key")
	tokenKey = flag.String("token-key", "authorization", "the metadata key of -token (other than authorization: the token alone)")
	send     = flag.String("send", "hello", "unary, acks: the messages, separated by |")
	pause    = flag.Duration("pause", 0, "acks: the wait before each message after the first")
	ticks    = flag.Int("ticks", 15, "ticks: how many")
	tickGap  = flag.Duration("tick-gap", 100*time.Millisecond, "ticks: the service's pause between them")
	tickTail = flag.String("tail", "", "ticks: what every odd-numbered tick ends with")
	timeout  = flag.Duration("timeout", 30*time.Second, "the whole call")
)

// line is one JSON line of output.
type line struct {
	Case     string `json:"case,omitempty"`
	Problems string `json:"problems,omitempty"`
	Msg      string `json:"msg,omitempty"`
	At       int64  `json:"at,omitempty"` // when the message was read, Unix nanoseconds
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}

func emit(l line) {
	b, _ := json.Marshal(l)
	fmt.Println(string(b))
}

func main() {
	flag.Parse()
	cc, err := grpc.NewClient(*target, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{})))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, grpcecho.CallIDKey, *callID)
	if *token != "" {
		v := *token
		if *tokenKey == "authorization" {
			v = "Bearer " + v
		}
		ctx = metadata.AppendToOutgoingContext(ctx, *tokenKey, v)
	}
	switch *scenario {
	case "cases":
		runCases(ctx, cc)
	case "unary":
		runUnary(ctx, cc)
	case "ticks":
		runTicks(ctx, cc)
	case "acks":
		runAcks(ctx, cc)
	default:
		fmt.Fprintf(os.Stderr, "unknown scenario %q\n", *scenario)
		os.Exit(2)
	}
}

// runCases makes every call of grpcecho.Cases, one line each.
func runCases(ctx context.Context, cc *grpc.ClientConn) {
	for _, c := range grpcecho.Cases {
		emit(line{Case: c.Method + " " + strings.Join(c.Send, ","), Problems: c.Check(ctx, cc)})
	}
}

func runUnary(ctx context.Context, cc *grpc.ClientConn) {
	got, _, err := grpcecho.Call(ctx, cc, grpcecho.Unary, *send)
	for _, m := range got {
		emit(line{Msg: m, At: time.Now().UnixNano()})
	}
	emitStatus(err)
}

func emitStatus(err error) {
	st := status.Convert(err)
	emit(line{Code: st.Code().String(), Message: st.Message()})
}

func stream(ctx context.Context, cc *grpc.ClientConn, method string) (grpc.ClientStream, error) {
	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true, ClientStreams: true}
	return cc.NewStream(ctx, desc, "/"+grpcecho.ServiceName+"/"+method, grpc.ForceCodec(grpcecho.Codec{}))
}

// runTicks asks for the ticks and prints each as it is read.
func runTicks(ctx context.Context, cc *grpc.ClientConn) {
	s, err := stream(ctx, cc, grpcecho.Ticks)
	if err == nil {
		spec, _ := json.Marshal(grpcecho.TickSpec{Count: *ticks, Gap: *tickGap, Tail: *tickTail})
		if err = sendMsg(s, spec); err == nil {
			err = s.CloseSend()
		}
	}
	if err == nil {
		err = readAll(s)
	}
	emitStatus(err)
}

// sendMsg sends b on s. A stream the server has ended answers a send with
// io.EOF; the status that says why comes from the next read.
func sendMsg(s grpc.ClientStream, b []byte) error {
	err := s.SendMsg(&b)
	if errors.Is(err, io.EOF) {
		var x []byte
		if rerr := s.RecvMsg(&x); rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
	}
	return err
}

// readAll prints every message until the status.
func readAll(s grpc.ClientStream) error {
	for {
		var b []byte
		err := s.RecvMsg(&b)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		emit(line{Msg: string(b), At: time.Now().UnixNano()})
	}
}

// runAcks sends each message and reads its answer before the next: the
// answer can only come if the message was forwarded as it was sent.
func runAcks(ctx context.Context, cc *grpc.ClientConn) {
	s, err := stream(ctx, cc, grpcecho.Acks)
	for i, m := range strings.Split(*send, "|") {
		if err != nil {
			break
		}
		if i > 0 {
			time.Sleep(*pause)
		}
		if err = sendMsg(s, []byte(m)); err != nil {
			break
		}
		var got []byte
		if err = s.RecvMsg(&got); err == nil {
			emit(line{Msg: string(got), At: time.Now().UnixNano()})
		}
	}
	if err == nil {
		if err = s.CloseSend(); err == nil {
			err = readAll(s)
		}
	}
	emitStatus(err)
}
