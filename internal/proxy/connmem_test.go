package proxy_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/membudget"
)

// connBudget is limits.memory in TestHeldRequestsDrawOnTheBudget: hook bodies
// set aside 1 MiB (one hook body), leaving about 1 MiB to connections: a few
// held intercepted requests.
const connBudget = 2 << 20

// TestHeldRequestsDrawOnTheBudget: intercepted requests held open (a body
// declared and never sent) draw on the memory budget for their connection,
// their tunnel and the request egressd forwards; once it is spent, the newest is
// refused 503 overloaded on its CONNECT or its request (detail memory_conns, or
// hook_lane when refused at accept),
// while those held keep working and a pre-tool hook call still gets the
// endpoint's answer. Their cost returns to the budget when they close.
func TestHeldRequestsDrawOnTheBudget(t *testing.T) {
	w := newAllowHookWorld(t, withBudget(connBudget))
	const conns = 16 // 16 x (12 + 80 + 112) KiB: past the 1 MiB left
	var held []net.Conn
	var refused int
	for i := range conns {
		c, outcome := w.holdRequest(t)
		switch outcome {
		case "held":
			held = append(held, c)
		case "503 overloaded memory_conns", "503 overloaded hook_lane":
			// Refused at accept, a CONNECT to a hook host is admitted to
			// the hook lane, which carries nothing but a hook call.
			refused++
		default:
			t.Fatalf("held request %d: %s, want it held or refused overloaded (memory_conns or hook_lane)", i, outcome)
		}
	}
	if refused == 0 || len(held) == 0 {
		t.Fatalf("%d of %d held requests refused, %d held: want some of each", refused, conns, len(held))
	}
	perHeld := membudget.ConnCost + membudget.TunnelCost + membudget.RequestCost
	if got := w.budgetHeld("conns"); got < float64(int64(len(held))*perHeld) || got > connBudget {
		t.Errorf("connections hold %.0f bytes of the budget, want at least %d for %d held requests and at most %d",
			got, int64(len(held))*perHeld, len(held), connBudget)
	}
	tc, _ := w.interceptedH1(t, "policy.allowed.test")
	if status, b := postHookCall(t, tc); status != 200 || !strings.Contains(b, `"allow"`) {
		t.Errorf("hook call with the budget spent: %d %s, want the endpoint's allow", status, b)
	}
	for _, c := range held {
		c.Close()
	}
	tc.Close()
	waitFor(t, func() bool { return w.budgetHeld("conns") == 0 }, "the held connections' cost to return to the budget")
	t.Logf("%d held requests held, %d refused", len(held), refused)
}

// holdRequest opens an intercepted tunnel to policy.allowed.test and sends a
// request whose body never comes (the endpoint reads bodies to their end):
// "held" when nothing answers it within a moment, else the refusal's status,
// reason and detail.
func (w *world) holdRequest(t *testing.T) (net.Conn, string) {
	t.Helper()
	c, br := w.dialProxy(t)
	io.WriteString(c, "CONNECT policy.allowed.test:443 HTTP/1.1\r\nHost: policy.allowed.test:443\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return c, refusalOutcome(resp)
	}
	tc := tls.Client(&replayConn{Conn: c, br: br}, &tls.Config{ServerName: "policy.allowed.test", RootCAs: w.CAPool,
		NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(tc, "POST /held HTTP/1.1\r\nHost: policy.allowed.test\r\nContent-Length: 100000\r\n\r\nx")
	tc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	tbr := bufio.NewReader(tc)
	if _, err := tbr.Peek(1); err != nil {
		tc.SetReadDeadline(time.Time{})
		return tc, "held"
	}
	resp, err = http.ReadResponse(tbr, nil)
	if err != nil {
		t.Fatalf("reading the held request's answer: %v", err)
	}
	return tc, refusalOutcome(resp)
}

func refusalOutcome(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	detail := ""
	if i := strings.Index(string(b), `"detail":"`); i >= 0 {
		detail, _, _ = strings.Cut(string(b[i+len(`"detail":"`):]), `"`)
	}
	return strings.TrimSpace(fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("Egressd-Reason"), detail))
}

// TestPlaceholderBodiesDrawOnTheBudget: with placeholders to replace, a request
// body of known length is read whole into a buffer of its declared length before
// anything is forwarded; requests that declare most of a megabyte and send one
// byte hold those buffers, which draw on the memory budget: once it is spent,
// the newest is refused 503 overloaded (detail memory_placeholders) at once, and
// the buffers return to the budget when their requests end.
func TestPlaceholderBodiesDrawOnTheBudget(t *testing.T) {
	w := newPlaceholderWorldLimits(t, withBudget(8<<20))
	holdBodiesUntilRefused(t, w, "placeholders", func(i int) (net.Conn, *bufio.Reader) {
		c, br := w.dialProxy(t)
		fmt.Fprintf(c, "POST http://api.allowed.test/held/%d HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: %d\r\n\r\nx", i, heldBody)
		return c, br
	})
}

// heldBody is what holdBodiesUntilRefused's requests declare: within
// placeholder.MaxBody and sigv4.MaxHashedBody, so read whole.
const heldBody = 1<<20 - 1

// holdBodiesUntilRefused sends requests (send writes the i-th: declaring heldBody
// bytes, sending one) under an 8 MiB budget until one is refused 503 overloaded,
// detail memory_<holder>, after at least one was held; then it ends the held ones
// and waits for their buffers to return to the budget.
func holdBodiesUntilRefused(t *testing.T, w *world, holder string, send func(i int) (net.Conn, *bufio.Reader)) {
	t.Helper()
	var held []net.Conn
	for i := range 8 { // 8 MiB declared: past the 4 MiB left beside the hook share
		c, br := send(i)
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := br.Peek(1); err != nil {
			held = append(held, c)
			continue
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		assertRefused(t, resp, http.StatusServiceUnavailable, "overloaded", "memory_"+holder)
		if len(held) == 0 {
			t.Fatal("the first held body was refused")
		}
		for _, c := range held {
			c.Close()
		}
		waitFor(t, func() bool { return w.budgetHeld(holder) == 0 }, "the held bodies' buffers to return to the budget")
		t.Logf("%d bodies of %d bytes held, the next refused", len(held), heldBody)
		return
	}
	t.Fatalf("%d bodies declaring %d bytes all held: none refused by the budget", len(held), heldBody)
}

// TestTransparentTunnelsDrawOnTheBudget: on a transparent listener, an
// intercepted TLS connection draws a tunnel's cost when egressd terminates its
// TLS (a CONNECT's is drawn when it is read); past the budget the newest is
// refused before its handshake (no answer fits in TLS not yet begun: closed, and
// logged overloaded/memory_conns) while those held keep their cost reserved.
func TestTransparentTunnelsDrawOnTheBudget(t *testing.T) {
	w := newInjectWorld(t, worldOpts{allowlist: injectEntries[:2], limits: withBudget(connBudget)})
	sb := w.serveTransparent(t)
	var held, refused int
	for range 20 { // 20 x (12 + 80) KiB: past the 1 MiB left beside the hook share
		if _, err := w.tlsFromSandbox(t, sb, w.PublicIP+":443", "api.allowed.test"); err != nil {
			refused++
			continue
		}
		held++
	}
	if refused == 0 || held == 0 {
		t.Fatalf("%d of 20 intercepted transparent connections refused, %d held: want some of each", refused, held)
	}
	w.waitLog(t, func(l map[string]any) bool { return l["reason"] == "overloaded" && l["detail"] == "memory_conns" })
	if got, want := w.budgetHeld("conns"), float64(int64(held)*(membudget.ConnCost+membudget.TunnelCost)); got < want {
		t.Errorf("connections hold %.0f bytes of the budget, want at least %.0f for %d held", got, want, held)
	}
	t.Logf("%d held, %d refused", held, refused)
}
