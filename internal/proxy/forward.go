package proxy

import (
	"crypto/tls"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// roundTrip forwards out on the transport that matches the client's protocol. The
// response's Egressd-* fields are removed here, on every path (plain, intercepted,
// upgrades, hook calls): only egressd sets them, and an upstream must not be able to
// fake Egressd-Reason or the fail-closed marker. Trailers, which arrive after the
// body, are filtered by the response writers.
func (rt *Runtime) roundTrip(out *http.Request, rec *Record) (*http.Response, error) {
	resp, err := rt.send(out, rec)
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

func (rt *Runtime) send(out *http.Request, rec *Record) (*http.Response, error) {
	if out.ProtoMajor >= 2 {
		return rt.viaTransport(rt.transport, out, rec, nil)
	}
	return rt.sendH1(out, rec)
}

// viaTransport forwards out on tr, recording the upstream address; declined, when
// not nil, is set if a TLS handshake for it confirmed no ALPN protocol.
func (rt *Runtime) viaTransport(tr *http.Transport, out *http.Request, rec *Record, declined *atomic.Bool) (*http.Response, error) {
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { rec.setResolved(i.Conn.RemoteAddr()) }}
	if declined != nil {
		trace.TLSHandshakeDone = func(st tls.ConnectionState, err error) {
			if err == nil && st.NegotiatedProtocol == "" {
				declined.Store(true)
			}
		}
	}
	hold, err := rt.holdUpstreamWindow(tr, rec)
	if err != nil {
		return nil, err
	}
	return hold.keep(tr.RoundTrip(out.WithContext(httptrace.WithClientTrace(out.Context(), trace))))
}
