package grpcecho

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Ticks and Acks time streams end to end: a test compares when each message
// left the service (Record.Sent) with when its client read it, and what arrived
// (Record.Got) with what the client sent. A call is named by its CallIDKey
// metadata, which the test reads back with Service.Call.
const (
	Ticks     = "Ticks" // one TickSpec in; Count messages out, Gap apart
	Acks      = "Acks"  // every message recorded and answered "ack <n>" at once
	CallIDKey = "x-call-id"
)

// maxTicks bounds one Ticks call.
const maxTicks = 1000

// TickSpec is the request of a Ticks call, as JSON.
type TickSpec struct {
	Count int           `json:"count"`
	Gap   time.Duration `json:"gap"`
	// Tail ends every odd-numbered message: bytes that may begin a secret are
	// what a scrubbing proxy holds back, so such a message shows whether the
	// proxy releases them while the stream pauses.
	Tail string `json:"tail"`
}

// TickMessage is message i of a Ticks call with tail.
func TickMessage(i int, tail string) string {
	if i%2 == 1 {
		return fmt.Sprintf("tick %d %s", i, tail)
	}
	return fmt.Sprintf("tick %d", i)
}

// AckMessage is the answer to the i-th message of an Acks call.
func AckMessage(i int) string { return fmt.Sprintf("ack %d", i) }

// Record is what the service did in one call.
type Record struct {
	mu   sync.Mutex
	sent []time.Time
	got  []string
}

// Sent is when each message of a Ticks call was handed to the transport.
func (r *Record) Sent() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.sent...)
}

// Got is every message an Acks call received.
func (r *Record) Got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// Call returns the record of the call whose metadata carried CallIDKey id, or
// nil when there was none.
func (s *Service) Call(id string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

// record returns the record of the call ctx belongs to, made on first use.
func (s *Service) record(ctx context.Context) *Record {
	md, _ := metadata.FromIncomingContext(ctx)
	id := ""
	if v := md.Get(CallIDKey); len(v) > 0 {
		id = v[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]*Record{}
	}
	if s.calls[id] == nil {
		s.calls[id] = &Record{}
	}
	return s.calls[id]
}

func (s *Service) ticks(_ any, ss grpc.ServerStream) error {
	s.saw(ss.Context())
	rec := s.record(ss.Context())
	var in []byte
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	var spec TickSpec
	if err := json.Unmarshal(in, &spec); err != nil || spec.Count > maxTicks {
		return status.Errorf(codes.InvalidArgument, "not a TickSpec of at most %d ticks: %q", maxTicks, in)
	}
	for i := range spec.Count {
		if i > 0 {
			select {
			case <-time.After(spec.Gap):
			case <-ss.Context().Done():
				return ss.Context().Err()
			}
		}
		out := []byte(TickMessage(i, spec.Tail))
		if err := ss.SendMsg(&out); err != nil {
			return err
		}
		rec.mu.Lock()
		rec.sent = append(rec.sent, time.Now())
		rec.mu.Unlock()
	}
	return nil
}

func (s *Service) acks(_ any, ss grpc.ServerStream) error {
	s.saw(ss.Context())
	rec := s.record(ss.Context())
	for i := 0; ; i++ {
		var in []byte
		err := ss.RecvMsg(&in)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rec.mu.Lock()
		rec.got = append(rec.got, string(in))
		rec.mu.Unlock()
		out := []byte(AckMessage(i))
		if err := ss.SendMsg(&out); err != nil {
			return err
		}
	}
}
