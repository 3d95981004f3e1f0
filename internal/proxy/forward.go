package proxy

import (
	"net/http"
)

// forward sends out upstream (upstream.Client.RoundTrip). The response's Egressd-*
// fields are removed here, on every path (plain, intercepted, upgrades, hook calls):
// only egressd sets them, and an upstream must not be able to fake Egressd-Reason
// or the fail-closed marker. Trailers, which arrive after the body, are filtered by
// the response writers.
func (snap *Snapshot) forward(out *http.Request) (*http.Response, error) {
	resp, err := snap.upstream.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	removeEgressdHeaders(resp.Header)
	return resp, nil
}
