package clients_test

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/echo"
	"github.com/egressd/egressd/internal/testutil/egressdtest"
)

// clientCase is one client doing one thing, in each mode it names. Its path is
// unique to the case and the mode (/clients/<mode>/<n>/), so the stand-in's record
// of it is found among every parallel case's.
type clientCase struct {
	client, name string
	tool         string // what need checks
	modes        []mode // nil: both
	timed        bool   // measures latency: runs alone, after the parallel cases
	run          func(t *testing.T, w *world, path string)
}

// TestClients runs every case in explicit and transparent mode, one egressd per
// mode: first every untimed case of both modes in parallel, then the timed ones
// (streams whose every message is timed) one at a time, so that no other client
// of the suite competes with them for the CPU. The idle-gap gRPC stream of each
// mode runs beside all of them and is checked last. The matrix of client x mode
// x result and the latency distributions are logged at the end.
func TestClients(t *testing.T) {
	mx := newMatrix()
	t.Cleanup(func() { t.Logf("client x mode x result:\n%s", mx) })
	worlds := []*world{newWorld(t, explicit, mx), newWorld(t, transparent, mx)}
	var idle []*idleCall
	for _, w := range worlds {
		idle = append(idle, w.startIdleGap())
	}
	t.Run("clients", func(t *testing.T) {
		for _, w := range worlds {
			w.runCases(t, false)
		}
	})
	t.Run("timed", func(t *testing.T) {
		for _, w := range worlds {
			w.runCases(t, true)
		}
	})
	for i, w := range worlds {
		name := "bidi stream quiet for " + idleGap.String()
		t.Run(string(w.mode)+"/grpc-go/"+name, func(t *testing.T) {
			mx.track(t, "grpc-go", name, w.mode)
			idle[i].check(t, w)
		})
	}
	t.Run("latency", func(t *testing.T) {
		for _, w := range worlds {
			w.lat.report(t)
		}
	})
}

// runCases runs the world's timed or untimed cases as subtests of t: the
// untimed in parallel, the timed one after another.
func (w *world) runCases(t *testing.T, timed bool) {
	for i, c := range allCases() {
		if c.timed != timed || (c.modes != nil && !hasMode(c.modes, w.mode)) {
			continue
		}
		t.Run(strings.TrimSuffix(string(w.mode)+"/"+c.client+"/"+c.name, "/"), func(t *testing.T) {
			if !timed {
				t.Parallel()
			}
			if c.name != "" { // a batch tracks each of its requests
				w.mx.track(t, c.client, c.name, w.mode)
			}
			need(t, c.tool)
			c.run(t, w, casePath(w.mode, i))
		})
	}
}

func allCases() []clientCase {
	var cs []clientCase
	for _, part := range [][]clientCase{curlCases, pythonCases(), nodeCases(), grpcCases, sseCases, refusalPrinters} {
		cs = append(cs, part...)
	}
	return cs
}

func hasMode(ms []mode, m mode) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

func casePath(m mode, i int) string { return "/clients/" + string(m) + "/" + itoa(i) + "/" }

// expect is what the stand-in must have received, and what the client must
// have printed of it.
type expect struct {
	host  string
	proto string // the stand-in's side: "HTTP/1.1", "HTTP/2.0"; "" either
	tls   bool
	auth  string // the Authorization the stand-in saw (redacted): "" none
	body  string // "" none
}

// assertServed checks the stand-in's record of path against want, and that the
// client printed the stand-in's answer: the echo of that same request.
func (w *world) assertServed(t *testing.T, path, printed string, want expect) {
	t.Helper()
	var echoed echo.Request
	if err := json.Unmarshal([]byte(printed), &echoed); err != nil || echoed.Path != path {
		t.Errorf("the client printed %q, want the stand-in's echo of %s", printed, path)
	} else if a := echoed.Header.Get("Authorization"); a != want.auth {
		t.Errorf("the client printed an echo with Authorization %q, want %q", a, want.auth)
	}
	got, ok := w.up.saw(path)
	if !ok {
		t.Errorf("the stand-in received no request for %s", path)
		return
	}
	if got.Host != want.host || got.TLS != want.tls || (want.proto != "" && got.Proto != want.proto) {
		t.Errorf("the stand-in saw Host %q, TLS %v, %s; want %q, %v, %s", got.Host, got.TLS, got.Proto,
			want.host, want.tls, or(want.proto, "any protocol"))
	}
	if a := got.Header.Values("Authorization"); (want.auth == "" && len(a) != 0) || (want.auth != "" && (len(a) != 1 || a[0] != want.auth)) {
		t.Errorf("the stand-in saw Authorization %q, want %q", a, want.auth)
	}
	if !sameBody(got.Body, want.body) {
		t.Errorf("the stand-in saw body %q, want %q", got.Body, want.body)
	}
}

// assertNotServed fails if the stand-in received a request for path.
func (w *world) assertNotServed(t *testing.T, path string) {
	t.Helper()
	for _, r := range w.up.Requests() {
		if r.Path == path {
			t.Errorf("the stand-in received %s %s, which egressd must refuse", r.Method, path)
		}
	}
}

// assertRefusal checks that printed is egressd's refusal body with reason.
func assertRefusal(t *testing.T, printed, reason string) {
	t.Helper()
	var rb egressdtest.Refusal
	if err := json.Unmarshal([]byte(printed), &rb); err != nil {
		t.Errorf("the client printed %q, want egressd's refusal (%s)", printed, reason)
		return
	}
	if rb.Reason != reason || rb.RequestID == "" || rb.Message == "" {
		t.Errorf("refusal reason %q, request_id %q, message %q; want %s with an ID and a message",
			rb.Reason, rb.RequestID, rb.Message, reason)
	}
}

// sinkholeNote explains a refusal that never reached egressd in transparent mode:
// the DNS guard refused the name instead of answering with egressd's own address
// (dns.refused_names: sinkhole), so the client failed to resolve it.
func sinkholeNote(m mode, printed string) string {
	if m == transparent && resolveFailure.MatchString(printed) {
		return " (the DNS guard refused the name: the client can read a refusal only from an egressd that sinkholes names off the allowlist, dns.refused_names: sinkhole)"
	}
	return ""
}

var resolveFailure = regexp.MustCompile(`(?i)resolve|name resolution|getaddrinfo|EAI_AGAIN|ENOTFOUND|no such host|produced zero addresses`)

// sameBody compares bodies, JSON ones by value (each client spaces JSON its way).
func sameBody(got, want string) bool {
	var g, w any
	if json.Unmarshal([]byte(got), &g) == nil && json.Unmarshal([]byte(want), &w) == nil {
		return reflect.DeepEqual(g, w)
	}
	return got == want
}

func itoa(i int) string { return strconv.Itoa(i) }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
