package clients_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/grpcecho"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// The addresses of the suite. They exist only inside the test's network namespace,
// on lo; outside it they belong to somebody else and are never dialled.
const (
	// publicIP stands for the public address of every allowlisted host.
	publicIP = "93.184.216.34"
	// forbiddenIP stands for evil.example, a host off the allowlist: it must never
	// see a connection.
	forbiddenIP = "93.184.215.14"
)

// The stand-ins' real names: each is served by the one stand-in on publicIP,
// answering for the name the client asked for.
const (
	githubHost    = "api.github.com"           // allowlisted, nothing injected: spliced
	plainHost     = "example.com"              // allowlisted, plain http:// too
	openaiHost    = "api.openai.com"           // credential openai: intercepted, injected, scrubbed
	pubsubHost    = "pubsub.googleapis.com"    // credential gcp (gRPC): intercepted, injected, scrubbed
	firestoreHost = "firestore.googleapis.com" // the trusted domain of the placeholder's credential
	evilHost      = "evil.example"             // off the allowlist
)

var standInNames = []string{githubHost, plainHost, openaiHost, pubsubHost, firestoreHost}

// The planted values, random per run so that nothing in egressd can match them by
// accident. openaiSecret and gcpSecret are injected as bearer tokens;
// firestoreValue is what egressd puts where the sandbox's placeholder was. None
// may reach a client, a log, or an upstream it is not for.
var (
	openaiSecret = "sk-clients-" + randomHex(12)
	gcpSecret    = "ya29.clients-" + randomHex(12)
	// firestoreValue is exactly as long as its placeholder (egressd_ph_<id>_<32
	// hex digits>), so that replacing one inside a gRPC message keeps the
	// message's length prefix true (see TestClients' placeholder case).
	firestoreValue = "fs-" + randomHex((len("egressd_ph_"+firestoreCredential+"_")+32-3)/2)
)

const firestoreCredential = "firestore"

// secrets are every planted value, with the mark the stand-in reports instead.
var secrets = map[string]string{openaiSecret: "<OPENAI>", gcpSecret: "<GCP>", firestoreValue: "<FIRESTORE>"}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// redact replaces every planted value by its mark, so that a value in what a
// client printed can only have come from egressd.
func redact(s string) string {
	for v, mark := range secrets {
		s = strings.ReplaceAll(s, v, mark)
	}
	return s
}

// standIn is the upstream of every allowlisted name: internal/testutil/echo, which
// answers each request with what it received (redacted), plus a gRPC service
// (grpcecho) for HTTP/2 application/grpc requests and an SSE stream under ssePath.
// The forbidden address has a listener that counts connections: none may come.
type standIn struct {
	*echo.Server
	ca        *testpki.CA
	grpc      *grpc.Server
	svc       *grpcecho.Service
	mu        sync.Mutex
	sseSent   map[string][]time.Time // by request path: when each event was flushed
	forbidden atomic.Int64
}

var (
	standInOnce sync.Once
	sharedUp    *standIn
)

// upstream starts the stand-in on first use, inside the namespace. It is never
// stopped: the process ends with the run.
func upstream(t *testing.T) *standIn {
	t.Helper()
	standInOnce.Do(func() { sharedUp = startStandIn(t) })
	if sharedUp == nil {
		t.Fatal("the stand-in upstream failed to start (see the first test's failure)")
	}
	return sharedUp
}

func startStandIn(t *testing.T) *standIn {
	s := &standIn{ca: testpki.New(t), svc: &grpcecho.Service{}, sseSent: map[string][]time.Time{}}
	s.grpc = s.svc.NewServer()
	s.Server = &echo.Server{Route: s.route, Redact: redact}
	s.Serve(listenOn(t, publicIP, "80"), nil)
	cert := s.ca.Leaf(t, standInNames...)
	s.Serve(listenOn(t, publicIP, "443"), &cert)
	for _, port := range []string{"80", "443"} {
		go s.countForbidden(listenOn(t, forbiddenIP, port))
	}
	return s
}

func (s *standIn) countForbidden(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.forbidden.Add(1)
		c.Close()
	}
}

// route sends gRPC calls to grpc-go and SSE requests to the stream; every other
// request is echoed.
func (s *standIn) route(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"):
		s.grpc.ServeHTTP(w, r)
	case strings.HasPrefix(r.URL.Path, ssePath):
		s.serveSSE(w, r)
	default:
		return false
	}
	return true
}

// ssePath is the prefix of the SSE stream: POST ssePath<id>?n=N&gap=D answers
// with an event holding what the stand-in received (the echo's JSON), then N
// events D apart, each flushed as written, then "data: [DONE]", as a model API
// streams a completion.
const ssePath = "/v1/stream/"

func (s *standIn) serveSSE(w http.ResponseWriter, r *http.Request) {
	got := s.Read(r)
	s.Record(got)
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	gap, _ := time.ParseDuration(r.URL.Query().Get("gap"))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	echoed, _ := json.Marshal(got)
	fmt.Fprintf(w, "data: %s\n\n", echoed)
	w.(http.Flusher).Flush()
	for i := range min(n, 1000) {
		time.Sleep(gap)
		fmt.Fprintf(w, "data: {\"i\": %d, \"delta\": %q}\n\n", i, sseDelta(i))
		w.(http.Flusher).Flush()
		s.mu.Lock()
		s.sseSent[r.URL.Path] = append(s.sseSent[r.URL.Path], time.Now())
		s.mu.Unlock()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// sseDelta is event i's text: every odd one ends with the start of a planted
// value, as a token stream may, whatever a scrubber makes of it.
func sseDelta(i int) string {
	if i%2 == 1 {
		return fmt.Sprintf("token %d %s", i, openaiSecret[:6])
	}
	return fmt.Sprintf("token %d", i)
}

// sseFlushed is when each event of the stream at path was flushed.
func (s *standIn) sseFlushed(path string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.sseSent[path]...)
}

// saw returns the request the stand-in recorded for path, waiting briefly (a
// refused client may print before egressd logs; a served one after the stand-in
// recorded), or false.
func (s *standIn) saw(path string) (echo.Request, bool) {
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, r := range s.Requests() {
			if r.Path == path {
				return r, true
			}
		}
		if time.Now().After(deadline) {
			return echo.Request{}, false
		}
	}
}

// listenOn listens on ip:port after adding ip to lo (inside the namespace only).
func listenOn(t *testing.T, ip, port string) net.Listener {
	t.Helper()
	netns.AddLoopbackAddr(t, netip.PrefixFrom(netip.MustParseAddr(ip), 32).String())
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, port))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
