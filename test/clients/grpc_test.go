package clients_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/grpcecho"
)

// The grpc-go cases run test/clients/grpcclient, a grpc-go program like a user's,
// against grpcecho's service behind the stand-in: pubsub.googleapis.com injects
// the gcp credential (intercepted and scrubbed), firestore.googleapis.com is the
// trusted domain of the environment_variable credential whose placeholder the
// sandbox holds.

// grpcLine is one JSON line of grpcclient.
type grpcLine struct {
	Case, Problems, Msg, Code, Message string
	At                                 int64
}

// grpcRun runs grpcclient against target with args; the call ID is the case's path.
func grpcRun(t *testing.T, w *world, callID, target string, args ...string) ([]grpcLine, output) {
	t.Helper()
	o := w.run(t, nil, os.Getenv(envGRPCClient), append([]string{"-target", target, "-call-id", callID}, args...)...)
	return jsonLines[grpcLine](o.stdout), o
}

// status is the call's last line: its status.
func lastStatus(ls []grpcLine) grpcLine {
	if len(ls) == 0 {
		return grpcLine{Code: "(nothing printed)"}
	}
	return ls[len(ls)-1]
}

var grpcCases = []clientCase{
	{client: "grpc-go", name: "unary, server, client and bidi streaming injected", tool: "grpcclient", run: grpcEveryKind},
	{client: "grpc-go", name: "server stream timed (ticks ending in a secret's start)", tool: "grpcclient", timed: true, run: grpcTicks},
	{client: "grpc-go", name: "bidi stream to a placeholder's trusted domain", tool: "grpcclient", run: grpcPlaceholder},
	{client: "grpc-go", name: "refused not_allowlisted", tool: "grpcclient", run: grpcRefused(evilHost, nil, "not_allowlisted")},
	// The placeholder in x-goog-api-key: in authorization, the header the entry
	// injects, egressd would drop it with the client's own copy.
	{client: "grpc-go", name: "refused credential_scope (placeholder off its domain)", tool: "grpcclient",
		run: func(t *testing.T, w *world, path string) {
			grpcRefused(pubsubHost, []string{"-token", w.placeholder, "-token-key", "x-goog-api-key"}, "credential_scope")(t, w, path)
		}},
}

// grpcEveryKind: every call kind of grpcecho.Cases, each with its answers, status
// and custom trailer, and the service saw exactly the injected authorization.
func grpcEveryKind(t *testing.T, w *world, path string) {
	ls, o := grpcRun(t, w, path, pubsubHost+":443", "-scenario", "cases")
	if len(ls) != len(grpcecho.Cases) {
		t.Fatalf("grpcclient printed %d results, want %d\n%s", len(ls), len(grpcecho.Cases), o)
	}
	for _, l := range ls {
		if l.Problems != "" {
			t.Errorf("%s: %s", l.Case, l.Problems)
		}
	}
	mds := w.up.metadata(path)
	if len(mds) != len(grpcecho.Cases) {
		t.Errorf("the service saw %d calls, want %d", len(mds), len(grpcecho.Cases))
	}
	for _, md := range mds {
		if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+gcpSecret {
			t.Errorf("the service saw %d authorization value(s), want exactly the injected one", len(a))
		}
	}
}

// Ticks: 15 messages 100 ms apart, every odd one ending with the first bytes of
// the injected token, so a scrubber that holds them back until the next read
// delays them by the gap.
const (
	tickCount = 15
	tickGap   = 100 * time.Millisecond
)

// grpcTicks times each message of a server stream from the service's send to the
// client's read.
func grpcTicks(t *testing.T, w *world, path string) {
	tail := gcpSecret[:6]
	label := func(i int) string { return grpcecho.TickMessage(i, "<token start>") }
	w.lat.measure(t, "grpc", label, func(run int) []time.Duration {
		callID := path + itoa(run) + "/"
		ls, o := grpcRun(t, w, callID, pubsubHost+":443", "-scenario", "ticks", "-ticks", itoa(tickCount),
			"-tick-gap", tickGap.String(), "-tail", tail)
		if st := lastStatus(ls); st.Code != "OK" {
			t.Fatalf("status %s %q, want OK\n%s", st.Code, st.Message, o)
		}
		msgs := ls[:len(ls)-1]
		rec := w.up.svc.Call(callID)
		if rec == nil || len(msgs) != tickCount || len(rec.Sent()) != tickCount {
			t.Fatalf("the client read %d messages of %d\n%s", len(msgs), tickCount, o)
		}
		var lat []time.Duration
		for i, m := range msgs {
			if want := grpcecho.TickMessage(i, tail); m.Msg != want {
				t.Errorf("message %d is %q, want %q", i, m.Msg, want)
			}
			lat = append(lat, time.Unix(0, m.At).Sub(rec.Sent()[i]))
		}
		return lat
	})
}

// grpcPlaceholder: a bidirectional stream to the placeholder's trusted domain,
// the placeholder in the metadata and inside the first message (the value is as
// long as the placeholder, so the message's length prefix stays true). Each
// message is answered before the next is sent, which works only if egressd
// forwards the body as it arrives; the service got the value, never the
// placeholder.
func grpcPlaceholder(t *testing.T, w *world, path string) {
	ls, o := grpcRun(t, w, path, firestoreHost+":443", "-scenario", "acks", "-token", w.placeholder,
		"-send", "key="+w.placeholder+"|second", "-timeout", "15s")
	if st := lastStatus(ls); st.Code != "OK" || len(ls) != 3 || ls[0].Msg != grpcecho.AckMessage(0) || ls[1].Msg != grpcecho.AckMessage(1) {
		t.Fatalf("the client printed %+v, want two acks and OK\n%s", ls, o)
	}
	rec := w.up.svc.Call(path)
	if rec == nil {
		t.Fatal("the service saw no call")
	}
	if got := rec.Got(); len(got) != 2 || got[0] != "key="+firestoreValue || got[1] != "second" {
		t.Errorf("the service got %q, want the first message with the value in place of the placeholder", redactAll(got))
	}
	for _, md := range w.up.metadata(path) {
		if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+firestoreValue {
			t.Errorf("the service saw authorization %q, want the value in place of the placeholder", redactAll(a))
		}
	}
}

func redactAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = redact(s)
	}
	return out
}

// grpcRefused: a unary call egressd refuses is a gRPC status the client reads:
// PERMISSION_DENIED with the reason in the message.
func grpcRefused(host string, args []string, reason string) func(*testing.T, *world, string) {
	return func(t *testing.T, w *world, path string) {
		ls, o := grpcRun(t, w, path, host+":443", append([]string{"-scenario", "unary", "-timeout", "15s"}, args...)...)
		st := lastStatus(ls)
		t.Logf("the client printed: code %s, message %q", st.Code, st.Message)
		if st.Code != "PermissionDenied" || !strings.Contains(st.Message, reason) {
			t.Fatalf("status %s %q, want PermissionDenied naming %s%s\n%s", st.Code, st.Message, reason,
				sinkholeNote(w.mode, st.Message), o)
		}
		if len(w.up.metadata(path)) != 0 {
			t.Error("the service saw the refused call")
		}
	}
}

// idleGap is how long the idle-gap stream stays quiet: longer than 15 s, and
// eight times limits.read_header, the deadline that used to end a quiet stream.
const idleGap = 16 * time.Second

// idleCall is the idle-gap stream running beside the other cases.
type idleCall struct {
	path string
	done chan output
}

// startIdleGap starts a bidirectional stream on the injected host that sends,
// is answered, stays quiet for idleGap, then sends again; check waits for it.
func (w *world) startIdleGap() *idleCall {
	c := &idleCall{path: "/clients/" + string(w.mode) + "/idle/", done: make(chan output, 1)}
	go func() {
		c.done <- w.exec(nil, os.Getenv(envGRPCClient), "-target", pubsubHost+":443", "-call-id", c.path,
			"-scenario", "acks", "-send", "before|after", "-pause", idleGap.String(), "-timeout", "45s")
	}()
	return c
}

func (c *idleCall) check(t *testing.T, w *world) {
	need(t, "grpcclient")
	o := <-c.done
	w.checkOutput(t, "grpcclient", o)
	ls := jsonLines[grpcLine](o.stdout)
	if st := lastStatus(ls); st.Code != "OK" || len(ls) != 3 || ls[1].Msg != grpcecho.AckMessage(1) {
		t.Fatalf("the client printed %+v, want both acks and OK after %v of quiet\n%s", ls, idleGap, o)
	}
	if rec := w.up.svc.Call(c.path); rec == nil || strings.Join(rec.Got(), "|") != "before|after" {
		t.Errorf("the service did not get both messages")
	}
	if gap := time.Duration(ls[1].At - ls[0].At); gap < idleGap {
		t.Errorf("the answers came %v apart, want at least the gap %v", gap, idleGap)
	}
}
