package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
)

// connMode is how a connection's requests are read and decided. It is fixed when
// the connection is accepted (explicit, transparent) or when the tunnel it runs in
// is intercepted (tunnel, refused), and never changes after.
type connMode uint8

const (
	// modeExplicit: absolute-form requests and CONNECT, each decided on its own target.
	modeExplicit connMode = iota
	// modeTransparent: plain HTTP redirected to a transparent listener, decided on
	// the Host header's name at the original destination's port.
	modeTransparent
	// modeTunnel: inside an intercepted tunnel; every request is decided against the
	// tunnel's target, never against its own Host.
	modeTunnel
	// modeRefused: inside a tunnel accepted only to say why it is refused; a hook
	// call gets its fail-closed deny, every other request the refusal.
	modeRefused
)

// route is a connection's mode with what that mode reads requests against.
type route struct {
	mode    connMode
	target  allowlist.Target // modeTunnel, modeRefused: the CONNECT target or SNI
	orig    netip.AddrPort   // modeTransparent: the original destination
	refusal error            // modeRefused: the answer to every request
	// plain: modeTunnel, modeRefused: a CONNECT tunnel that carries plain HTTP, not
	// TLS; its requests are decided as http:// requests.
	plain bool
}

// tunnelRoute is the route of the requests inside an intercepted tunnel to t:
// decided again (why == nil) or all refused with why.
func tunnelRoute(t allowlist.Target, why error) route {
	if why != nil {
		return route{mode: modeRefused, target: t, refusal: why}
	}
	return route{mode: modeTunnel, target: t}
}

// inTunnel reports whether the requests arrive inside an intercepted tunnel.
func (r route) inTunnel() bool { return r.mode == modeTunnel || r.mode == modeRefused }

// tunnelKind is what a tunnel (a CONNECT, or TLS on a transparent listener) becomes.
type tunnelKind uint8

const (
	tunnelRefused       tunnelKind = iota // the refusal replaces the CONNECT's 200; the connection closes
	tunnelSpliced                         // dialled and copied both ways, unread
	tunnelIntercepted                     // TLS terminated; requests inside in modeTunnel
	tunnelRefusedInside                   // TLS terminated only to refuse every request (modeRefused)
)

// tunnelPlan is what a tunnel becomes and, when refused, why.
type tunnelPlan struct {
	kind tunnelKind
	why  error
}

// planTunnel is the one place that decides whether a tunnel to t is intercepted:
// when the rule injects or intercept is "all" (d.Intercept), when t serves hook URLs
// or trusts a placeholder; spliced otherwise. inTLS is set when the client has
// already sent its ClientHello (a transparent listener), so a refusal can only be
// answered inside TLS.
func planTunnel(snap *Snapshot, t allowlist.Target, d allowlist.Decision, inTLS bool) tunnelPlan {
	hookHost := snap.Hooks != nil && snap.Hooks.Index != nil && snap.Hooks.Index.Intercepts(t.Host, t.Port)
	if d.Allowed() && !d.Intercept && !hookHost {
		// Whether t trusts a placeholder is known once its credentials are read: wait,
		// bounded, for first reads still in flight after a start, rather than splice.
		snap.Placeholders.Await(context.Background())
	}
	switch {
	case d.Allowed() && (d.Intercept || hookHost || snap.Placeholders.Intercepts(t.Host)):
		return tunnelPlan{kind: tunnelIntercepted}
	case d.Allowed():
		return tunnelPlan{kind: tunnelSpliced}
	}
	// A denied tunnel to a hook host is still accepted and intercepted when hooks
	// fail closed: the runtime reads a refused CONNECT as "allow", so egressd answers
	// the hook call inside with an explicit deny.
	return refusedTunnel(snap, deny(d.Reason, d.Detail), inTLS || hookHost && snap.Hooks.FailClosed)
}

// decideTunnel is the one decision of a tunnel, a CONNECT (hello nil: it arrives
// after the 200) or TLS on a transparent listener: decide on t and record it, plan
// the tunnel (planTunnel, then helloPlan when the ClientHello is known), and dial a
// spliced tunnel's upstream now. A refused plan is recorded here; an upstream that
// cannot be dialled refuses the tunnel (refusedTunnel). The error is a ClientHello
// refused by helloPlan, told to the client as a TLS alert.
func (c *conn) decideTunnel(snap *Snapshot, t allowlist.Target, hello *clientHello, rec *Record) (tunnelPlan, net.Conn, error) {
	rec.setTarget(t)
	d := snap.Policy.DecideRequest(t, "")
	rec.setDecision(d)
	plan := planTunnel(snap, t, d, hello != nil)
	if hello != nil {
		var err error
		if plan, err = c.applyHelloPlan(snap, t, hello, plan); err != nil {
			rec.refused(err)
			return plan, nil, err
		}
	}
	var up net.Conn
	if plan.kind == tunnelSpliced {
		var err error
		if up, err = snap.upstream.Dial(c.ctx, t); err != nil {
			plan = refusedTunnel(snap, err, hello != nil)
		} else {
			rec.setResolved(up.RemoteAddr())
		}
	}
	if plan.why != nil {
		rec.refused(plan.why)
	}
	return plan, up, nil
}

// refusedTunnel is the plan of a tunnel refused with why. It is answered inside TLS
// (a leaf for the requested name, the refusal to the first request; clients show a
// response body, never a CONNECT's) when inside is set or tls.deny_in_tunnel is in
// effect with a CA; otherwise the refusal replaces the 200.
func refusedTunnel(snap *Snapshot, why error, inside bool) tunnelPlan {
	if inside || snap.DenyInTunnel && snap.Leaves != nil {
		return tunnelPlan{kind: tunnelRefusedInside, why: why}
	}
	return tunnelPlan{kind: tunnelRefused, why: why}
}

// leafNames reports whether a leaf for t names the CONNECT target as the client
// spelled it (authority), so that the client can verify egressd's certificate: not
// for a non-canonical IPv4 spelling (2130706433, 0x7f.1, 0177.0.0.1, 127.1), an IPv6
// text another client would spell differently, or a name that was not ASCII.
// Case and a trailing dot change nothing a verifier compares.
func leafNames(authority string, t allowlist.Target) bool {
	host := authority
	if h, _, err := net.SplitHostPort(authority); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	return host == t.Host
}

// readableFor is the plan for a CONNECT to authority: a refusal egressd would
// answer inside TLS replaces the 200 instead when no leaf could name the target as
// the client spelled it, since the client would show a certificate error, not the
// reason.
func (p tunnelPlan) readableFor(authority string, t allowlist.Target) tunnelPlan {
	if p.kind == tunnelRefusedInside && !leafNames(authority, t) {
		p.kind = tunnelRefused
	}
	return p
}

// helloPlan applies the ClientHello rules of a tunnel planned as spliced, which
// egressd will never read inside (docs/policy.md#clienthello-rules): a named target
// needs SNI, and Encrypted Client Hello, whose inner hello could name any tenant of
// the same edge, is intercepted where the sandbox trusts egressd's CA and refused
// elsewhere. The SNI itself was checked against the target when the hello was read.
func helloPlan(snap *Snapshot, t allowlist.Target, hello *clientHello, plan tunnelPlan) (tunnelPlan, error) {
	if plan.kind != tunnelSpliced {
		return plan, nil
	}
	switch {
	case hello.ech && snap.Policy.Intercepts():
		return tunnelPlan{kind: tunnelIntercepted}, nil
	case hello.ech:
		return plan, &refusal{Reason: allowlist.ReasonHostMismatch, Detail: detailECH,
			Err: errors.New("Encrypted Client Hello in a tunnel to " + t.Host + " that egressd does not intercept")}
	case hello.serverName == "" && !t.IsIP():
		return plan, &refusal{Reason: allowlist.ReasonHostMismatch, Detail: detailNoSNI,
			Err: errors.New("ClientHello without SNI in a tunnel to " + t.Host)}
	}
	return plan, nil
}

// Details of a spliced tunnel's ClientHello refused by helloPlan.
const (
	detailNoSNI = "no_sni"
	detailECH   = "ech"
)
