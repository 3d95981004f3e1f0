package proxy

import (
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// FuzzUpgradeTokens: whatever the Upgrade and TE fields hold, no h2c token that
// net/http's own token matcher finds survives dropH2C, nor HTTP2-Settings with it,
// and a "trailers" token it finds in TE is always kept; neither panics.
func FuzzUpgradeTokens(f *testing.F) {
	for _, s := range []string{"h2c", "websocket, h2c", "H2C", " h2c\t", "h2c/1", "websocket", "h2c,", ",h2c",
		"h2", "xh2c", "trailers", "gzip;q=0.5, trailers", "TRAILERS;q=1", "deflate"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, upgrade, te string) {
		h := http.Header{"Upgrade": strings.Split(upgrade, "\n"), "Te": strings.Split(te, "\n"),
			"Connection": {"Upgrade, HTTP2-Settings"}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}}
		offered := httpguts.HeaderValuesContainsToken(h["Upgrade"], "h2c")
		dropH2C(h)
		if httpguts.HeaderValuesContainsToken(h["Upgrade"], "h2c") {
			t.Fatalf("Upgrade %q: h2c left in %q", upgrade, h["Upgrade"])
		}
		if offered && (h.Get("Http2-Settings") != "" || httpguts.HeaderValuesContainsToken(h["Connection"], "http2-settings")) {
			t.Fatalf("Upgrade %q: HTTP2-Settings left: %v", upgrade, h)
		}
		if httpguts.HeaderValuesContainsToken(h["Te"], "trailers") && !acceptsTrailers(h) {
			t.Fatalf("TE %q names trailers but was not kept", te)
		}
	})
}
