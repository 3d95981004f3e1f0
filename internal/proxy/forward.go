package proxy

import (
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// roundTrip forwards out on the transport that matches the client's protocol. The
// response's Egressd-* fields are removed here, on every path (plain, intercepted,
// upgrades, hook calls): only egressd sets them, and an upstream must not be able to
// fake Egressd-Reason or the fail-closed marker. Trailers, which arrive after the
// body, are filtered by the response writers.
func (snap *Snapshot) roundTrip(out *http.Request, rec *Record) (*http.Response, error) {
	resp, err := snap.send(out, rec)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols && len(out.Header["Upgrade"]) == 0 {
		resp.Body.Close() // the Transport's 101: never tunnelled unasked
		return nil, errSwitched
	}
	removeEgressdHeaders(resp.Header)
	return resp, nil
}

func (snap *Snapshot) send(out *http.Request, rec *Record) (*http.Response, error) {
	if out.ProtoMajor >= 2 {
		return snap.viaTransport(snap.transport, out, rec, nil)
	}
	return snap.sendH1(out, rec)
}

// sendH1 forwards an HTTP/1.x client's request over HTTP/1.1, or over HTTP/2 to an
// upstream known or found to speak only that. It is found so by its TLS alert
// no_application_protocol (ALPN http/1.1 refused), or, on a fresh connection whose
// handshake confirmed no protocol, by closing without answering (grpc-go's
// servers complete such a handshake, then close).
func (snap *Snapshot) sendH1(out *http.Request, rec *Record) (*http.Response, error) {
	if snap.h2Only.has(out.URL.Host) {
		return snap.sendH2Only(out, rec, nil)
	}
	var resp *http.Response
	var err error
	var declined atomic.Bool
	if h1Eligible(out) {
		resp, err = snap.h1.roundTrip(out, rec)
	} else {
		resp, err = snap.viaTransport(snap.transportH1, out, rec, &declined)
	}
	if err != nil && out.URL.Scheme == "https" &&
		(refusedHTTP1(err) || errors.Is(err, errUnanswered) || (declined.Load() && isClosed(err))) {
		return snap.sendH2Only(out, rec, err)
	}
	return resp, err
}

// viaTransport forwards out on tr, recording the upstream address; declined, when
// not nil, is set if a TLS handshake for it confirmed no ALPN protocol.
func (snap *Snapshot) viaTransport(tr *http.Transport, out *http.Request, rec *Record, declined *atomic.Bool) (*http.Response, error) {
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { rec.setResolved(i.Conn.RemoteAddr()) }}
	if declined != nil {
		trace.TLSHandshakeDone = func(st tls.ConnectionState, err error) {
			if err == nil && st.NegotiatedProtocol == "" {
				declined.Store(true)
			}
		}
	}
	hold, err := snap.holdUpstreamWindow(tr, rec)
	if err != nil {
		return nil, err
	}
	return hold.keep(tr.RoundTrip(out.WithContext(httptrace.WithClientTrace(out.Context(), trace))))
}
