package proxy

import (
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// FuzzUpgradeTokens: whatever the Upgrade and TE fields hold, an h2c token that
// net/http's own token matcher finds is always refused, and a "trailers" token it
// finds in TE is always kept; neither check panics.
func FuzzUpgradeTokens(f *testing.F) {
	for _, s := range []string{"h2c", "websocket, h2c", "H2C", " h2c\t", "h2c/1", "websocket", "h2c,", ",h2c",
		"h2", "xh2c", "trailers", "gzip;q=0.5, trailers", "TRAILERS;q=1", "deflate"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, upgrade, te string) {
		h := http.Header{"Upgrade": strings.Split(upgrade, "\n"), "Te": strings.Split(te, "\n")}
		if httpguts.HeaderValuesContainsToken(h["Upgrade"], "h2c") && checkUpgrade(h) == nil {
			t.Fatalf("Upgrade %q names h2c but was not refused", upgrade)
		}
		if httpguts.HeaderValuesContainsToken(h["Te"], "trailers") && !acceptsTrailers(h) {
			t.Fatalf("TE %q names trailers but was not kept", te)
		}
	})
}
