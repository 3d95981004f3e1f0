package proxy

import (
	"net/http"
	"net/textproto"
	"slices"
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

// dropH2C removes a client's offer to upgrade to h2c (RFC 7540 §3.2: the Upgrade
// token, any case and version, with HTTP2-Settings and their Connection tokens), so
// the request is served over HTTP/1.1 as a server that ignores the offer would: a
// connection switched to cleartext HTTP/2 would carry requests egressd never
// inspects, and refusing the offer would break curl --http2 on every http:// URL.
// Other upgrades (WebSocket) in the same Upgrade field stay.
func dropH2C(h http.Header) {
	var kept []string
	offered := false
	for _, v := range h["Upgrade"] {
		for _, tok := range strings.Split(v, ",") {
			tok = textproto.TrimString(tok)
			name, _, _ := strings.Cut(tok, "/")
			switch {
			case strings.EqualFold(name, "h2c"):
				offered = true
			case tok != "":
				kept = append(kept, tok)
			}
		}
	}
	if !offered {
		return
	}
	delete(h, "Http2-Settings")
	if len(kept) > 0 {
		h["Upgrade"] = []string{strings.Join(kept, ", ")}
		dropConnectionTokens(h, "http2-settings")
		return
	}
	delete(h, "Upgrade")
	dropConnectionTokens(h, "upgrade", "http2-settings")
}

// dropConnectionTokens removes names from the Connection field's list.
func dropConnectionTokens(h http.Header, names ...string) {
	var kept []string
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			tok = textproto.TrimString(tok)
			if tok != "" && !slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, tok) }) {
				kept = append(kept, tok)
			}
		}
	}
	if delete(h, "Connection"); len(kept) > 0 {
		h["Connection"] = []string{strings.Join(kept, ", ")}
	}
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
