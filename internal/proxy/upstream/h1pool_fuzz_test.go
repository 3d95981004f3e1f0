package upstream

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// FuzzUpstreamResponse: whatever an upstream answers a GET with (then closing
// the connection), the pool and net/http's Transport agree on what the caller
// gets: the same refusal reason, or the same status, header, body bytes, body
// error and trailers. The differences by design are a 101 and a status code
// below 100, which the pool refuses (see their diffCases entries).
func FuzzUpstreamResponse(f *testing.F) {
	for _, tc := range diffCases {
		for _, st := range tc.steps {
			if st.resp != "" && len(st.resp) < 4096 {
				f.Add([]byte(st.resp))
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tc := diffCase{steps: []diffStep{{resp: string(data), close: true}}}
		pool := runDiff(t, "http", tc, poolPath).outcomes[0]
		tr := runDiff(t, "http", tc, transportPath).outcomes[0]
		if poolRefuses(tr) {
			if pool != "refused upstream_unreachable " {
				t.Fatalf("upstream sent %q\nthe pool gave:\n%s\nwant the refusal (the Transport gave %q)", data, pool, tr)
			}
			return
		}
		if pool != tr {
			t.Fatalf("upstream sent %q\nthe pool gave:\n%s\nthe Transport gave:\n%s", data, pool, tr)
		}
	})
}

// poolRefuses reports whether the Transport's outcome is one the pool refuses
// by design: a 101 or a status code below 100.
func poolRefuses(transport string) bool {
	var proto string
	var code int
	if _, err := fmt.Sscanf(transport, "%s %d", &proto, &code); err != nil || !strings.HasPrefix(proto, "HTTP/") {
		return false
	}
	return code < 100 || code == http.StatusSwitchingProtocols
}
