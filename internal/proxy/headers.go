package proxy

import (
	"errors"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/egressd/egressd/internal/allowlist"
)

// removeHopByHop deletes the hop-by-hop fields (allowlist.HopByHop) and every field the Connection header
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
	for _, name := range allowlist.HopByHop {
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

// checkUpgrade refuses a request whose Upgrade list names h2c (any case, with or
// without a version, with or without Connection: Upgrade or HTTP2-Settings): a
// connection switched to cleartext HTTP/2 would carry requests egressd never
// inspects. Other upgrades (WebSocket) pass.
func checkUpgrade(h http.Header) error {
	for _, v := range h["Upgrade"] {
		for _, tok := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(textproto.TrimString(tok), "/")
			if strings.EqualFold(name, "h2c") {
				return badRequest("h2c_upgrade", errors.New("an upgrade to h2c is refused"))
			}
		}
	}
	return nil
}

// switchesProtocol reports whether req asks to take the connection over (CONNECT,
// or any Upgrade): when it is refused, bytes the client may have sent after it
// belong to the other protocol and are never read as a request.
func switchesProtocol(req *http.Request) bool {
	return req.Method == http.MethodConnect || len(req.Header["Upgrade"]) > 0
}

// acceptsTrailers reports whether the client's TE field names "trailers", the one
// TE value that may travel on (HTTP/2 allows no other; gRPC sends it).
func acceptsTrailers(h http.Header) bool {
	for _, v := range h["Te"] {
		for _, tok := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(textproto.TrimString(tok), ";")
			if strings.EqualFold(textproto.TrimString(name), "trailers") {
				return true
			}
		}
	}
	return false
}
