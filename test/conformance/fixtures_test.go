package conformance_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/grpcecho"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// The addresses of the suite. They exist only inside the test's network namespace,
// on lo; outside it the public ones belong to somebody else and are never dialled.
const (
	// publicIP stands for the public address of the allowlisted upstreams.
	publicIP = "93.184.216.34"
	// forbiddenIP stands for a public host that is not on the allowlist (evil.test,
	// the lookalikes, the fronting targets): it must never see a byte.
	forbiddenIP = "93.184.215.14"
)

// canaryIPs are internal addresses nothing may reach. Each has a listener on ports
// 80 and 443 that counts connections and bytes.
var canaryIPs = []string{"127.0.0.1", "169.254.169.254", "10.0.0.5", "100.64.0.5", "fd00:ec2::254", "::1"}

// sinkPorts are the ports every canary and the forbidden upstream listen on.
var sinkPorts = []string{"80", "443"}

// The injected values. secret is the planted credential: egressd reads it from the
// credentials file and must never let it reach the sandbox, a log line, or any
// upstream but the one it is for. It is random per run so that no fixed string in
// egressd could match it by accident.
var (
	secret      = "sk-conformance-" + randomHex(12)
	staticValue = "static-" + randomHex(4) // the transform's X-Injected value; not a secret
)

// credentialHosts are the hosts whose entry injects the credential.
var credentialHosts = []string{"api.allowed.test", "plain.allowed.test"}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// fixtures are shared by every world in the process and live until it exits.
type fixtures struct {
	upstreamCA *testpki.CA
	echo       *echoServer
	forbidden  *sink   // forbiddenIP, every sink port
	canaries   []*sink // one per canary address and port
}

// allSinks returns every listener that must see nothing.
func (f *fixtures) allSinks() []*sink { return append([]*sink{f.forbidden}, f.canaries...) }

var (
	fixturesOnce sync.Once
	sharedFx     *fixtures
)

// getFixtures starts the shared upstreams and canaries on first use, inside the
// namespace. They are never stopped: the process ends with the run.
func getFixtures(t *testing.T) *fixtures {
	t.Helper()
	fixturesOnce.Do(func() { sharedFx = startFixtures(t) })
	if sharedFx == nil {
		t.Fatal("the shared upstreams and canaries failed to start (see the first test's failure)")
	}
	return sharedFx
}

func startFixtures(t *testing.T) *fixtures {
	t.Helper()
	f := &fixtures{upstreamCA: testpki.New(t), echo: newEchoServer()}
	f.startEcho(t)
	f.forbidden = startSink(t, "forbidden upstream", forbiddenIP, sinkPorts...)
	for _, ip := range canaryIPs {
		f.canaries = append(f.canaries, startSink(t, "canary "+ip, ip, sinkPorts...))
	}
	return f
}

// startEcho serves the echo upstream on publicIP: plain HTTP on :80 and HTTPS
// (HTTP/1.1 and HTTP/2) on :443 with a certificate from the test CA.
func (f *fixtures) startEcho(t *testing.T) {
	f.echo.Serve(listenOn(t, net.JoinHostPort(publicIP, "80")), nil)
	cert := f.upstreamCA.Leaf(t, "allowed.test", "*.allowed.test", "xn--bcher-kva.test", "ports.test", publicIP)
	f.echo.Serve(listenOn(t, net.JoinHostPort(publicIP, "443")), &cert)
}

// checkSinksUntouched is TestMain's last word: any connection to a canary or the
// forbidden upstream during the whole run fails it, whatever the cases said.
func checkSinksUntouched() int {
	if sharedFx == nil {
		return 0
	}
	code := 0
	for _, s := range sharedFx.allSinks() {
		if c, b := s.conns.Load(), s.bytes.Load(); c != 0 || b != 0 {
			fmt.Fprintf(os.Stderr, "conformance: %s saw %d connection(s) and %d byte(s) during the run\n", s.name, c, b)
			code = 1
		}
	}
	return code
}

// sink is a listener that must never be reached: it counts connections and bytes
// and keeps the first bytes it receives, so a case can say what leaked.
type sink struct {
	name  string
	conns atomic.Int64
	bytes atomic.Int64
	mu    sync.Mutex
	data  []byte
}

// maxSinkData bounds what a sink keeps of the bytes it receives.
const maxSinkData = 1 << 20

func startSink(t *testing.T, name, ip string, ports ...string) *sink {
	s := &sink{name: name}
	for _, port := range ports {
		go s.serve(listenOn(t, net.JoinHostPort(ip, port)))
	}
	return s
}

func (s *sink) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		go s.drain(c)
	}
}

// drain reads what the connection sends for a bounded time, then closes it.
func (s *sink) drain(c net.Conn) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			s.bytes.Add(int64(n))
			s.mu.Lock()
			if room := maxSinkData - len(s.data); room > 0 {
				s.data = append(s.data, buf[:min(n, room)]...)
			}
			s.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (s *sink) received() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.data)
}

// sinkCounts is a snapshot of every sink's connections and bytes.
type sinkCounts map[*sink][2]int64

func snapshotSinks(sinks []*sink) sinkCounts {
	c := sinkCounts{}
	for _, s := range sinks {
		c[s] = [2]int64{s.conns.Load(), s.bytes.Load()}
	}
	return c
}

// echoServer is the allowlisted upstream: internal/testutil/echo with the
// suite's routes. It answers with what it received, as JSON, with the planted
// secret replaced by secretMark, so that a secret in a response the sandbox reads
// can only have come from egressd itself. It also counts the requests to a
// credential host that arrived without exactly the injected credential.
type echoServer struct {
	*echo.Server
	withoutSecret atomic.Int64
	// grpc serves the gRPC calls that reach the echo (grpcecho's service, with
	// grpc-go's own server code behind net/http's HTTP/2 server).
	grpc    http.Handler
	grpcSvc *grpcecho.Service
}

func newEchoServer() *echoServer {
	e := &echoServer{grpcSvc: &grpcecho.Service{}}
	e.grpc = e.grpcSvc.NewServer()
	e.Server = &echo.Server{Route: e.route, Redact: redact}
	return e
}

// hookAllowPath is the echo upstream's policy endpoint: it answers every request
// with {"decision": "allow"} (and records it). Every other path echoes.
const hookAllowPath = "/hooks/allow"

// hookMislabelledPath is the echo upstream's policy endpoint that denies, reflecting
// the request's Authorization, with the Content-Encoding ?ce names (mislabelledDeny).
const hookMislabelledPath = "/hooks/mislabelled"

// mislabelledDeny answers a plain JSON deny labelled with the Content-Encoding of
// ?ce, whatever it is: a decoder egressd ran by the label would fail on it.
func mislabelledDeny(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Encoding", r.URL.Query().Get("ce"))
	fmt.Fprintf(w, `{"decision":"deny","reason":%q}`, "no curl for "+r.Header.Get("Authorization"))
}

// secretMark stands for the secret in the echo's answers.
const secretMark = "<SECRET>"

// echoed is what the echo upstream received.
type echoed = echo.Request

// route counts a credential host's request without the credential, and answers
// the suite's special paths itself; every other request is echoed.
func (e *echoServer) route(w http.ResponseWriter, r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	for _, h := range credentialHosts {
		if host == h && !hasExactlyCredential(r.Header) {
			e.withoutSecret.Add(1)
		}
	}
	switch {
	case r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"):
		e.grpc.ServeHTTP(w, r)
	case r.URL.Path == "/reflect": // an echo that does not redact: what egressd must scrub
		reflect(w, r)
	case r.URL.Query().Get("redirect") != "":
		e.Record(e.Read(r))
		w.Header().Set("Location", r.URL.Query().Get("redirect"))
		w.WriteHeader(http.StatusFound)
	case r.URL.Path == bigPath: // a large answer, for clients that never read it
		writeBig(w)
	case r.URL.Path == hookMislabelledPath:
		mislabelledDeny(w, r)
	case path.Clean(r.URL.Path) == hookAllowPath: // as most servers, it resolves dot segments
		e.Record(e.Read(r))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"decision": "allow"}`)
	default:
		if r.URL.Query().Get("forge") != "" {
			forgeEgressdFields(w)
		}
		return false
	}
	return true
}

// forgeEgressdFields makes the echo's answer carry Egressd-* fields only egressd
// may set: headers, an announced trailer and one never announced.
func forgeEgressdFields(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Egressd-Reason", "not_allowlisted")
	h.Set("Egressd-Hook", "fail-closed")
	h.Set("Trailer", "Egressd-Announced")
	h.Set(http.TrailerPrefix+"Egressd-Announced", "forged")
	h.Set(http.TrailerPrefix+"Egressd-Undeclared", "forged")
	h.Set(http.TrailerPrefix+"X-Undeclared", "kept")
}

// reflect sends the request's Authorization back as received: in the body, a
// cookie and, base64-encoded, a header, gzip-compressed when ?gzip is set.
func reflect(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	w.Header().Set("Set-Cookie", "session="+auth)
	w.Header().Set("X-Reflect", base64.StdEncoding.EncodeToString([]byte(auth)))
	body := io.Writer(w)
	if r.URL.Query().Has("gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		body = zw
	}
	io.WriteString(body, "you sent: "+auth+"\n")
}

func hasExactlyCredential(h http.Header) bool {
	v := h.Values("Authorization")
	return len(v) == 1 && v[0] == "Bearer "+secret
}

// staticMark stands for the transform's value: injected too, so egressd masks it
// in responses as it does the secret.
const staticMark = "<STATIC>"

func redact(s string) string {
	return strings.NewReplacer(secret, secretMark, staticValue, staticMark).Replace(s)
}

// listenOn listens on addr after adding its IP to lo (netns.AddLoopbackAddr: inside
// the namespace only; the suite never touches the host's interfaces).
func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		t.Fatal(err)
	}
	if !ip.IsLoopback() || ip.Is6() {
		netns.AddLoopbackAddr(t, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
