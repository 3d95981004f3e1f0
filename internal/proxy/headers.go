package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopByHop are the connection-specific fields of RFC 9110 §7.6.1, plus the legacy
// Proxy-Connection. Proxy-Authorization is for egressd, never for the upstream.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopByHop deletes the hop-by-hop fields and every field the Connection header
// names. It runs before anything is added, so a client's "Connection: Authorization"
// can only remove the client's own header, never an injected one.
func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		delete(h, name)
	}
}

// removeEgressdHeaders deletes every Egressd-* field: only egressd sets them.
func removeEgressdHeaders(h http.Header) {
	for name := range h {
		if len(name) >= 8 && strings.EqualFold(name[:8], "Egressd-") {
			delete(h, name)
		}
	}
}

// upgradeType returns the protocol a request asks to upgrade to, or "".
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(tok), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}
