// Package proxy is the only package that knows HTTP proxying: it accepts sandbox
// connections, decides every request and tunnel on the current Snapshot, forwards or
// refuses, and writes one Record per request or tunnel.
//
// The HTTP/1 front end is a small loop over net/http's request parser rather than
// net/http.Server or goproxy, for three reasons: the framing checks need the request
// head as sent (net/http silently drops Content-Length when Transfer-Encoding is
// present); a CONNECT tunnel must be handed the raw connection without a hijack
// dance; and responses are streamed straight from the upstream response with a
// flush per read, so server-sent events are never held in a buffer. goproxy in
// particular would need its environment proxy, default transport, public CA and
// inner-Host trust each overridden; none of them are used here.
//
// The files, in the order a request meets them (docs/architecture.md tells the
// whole path):
//
//	server.go       Server, Swap, Shutdown, and admission: accept, connection slots, the hook
//	                lane, what a connection and a request hold of the memory budget, deadlines
//	conn.go         one client connection: the request loop, handle, refusal writing
//	mode.go         the connection's mode (route); decideTunnel and planTunnel: what a tunnel becomes
//	head.go         the bounded request head and its framing checks
//	connect.go      CONNECT: decideTunnel, 200, ClientHello check, splice or intercept
//	transparent.go  the transparent listener: original destination, SNI target, decideTunnel
//	tlspeek.go      reading the ClientHello without consuming it
//	intercept.go    terminating the client's TLS in an intercepted tunnel
//	h1.go           the HTTP/1.x client side of a request (h1Side)
//	h2.go           HTTP/2 inside an intercepted tunnel, its client side (h2Side)
//	pipeline.go     each path in one screen, and the one request tail, exchange.serve
//	target.go       the target stage: the request's target, by connection mode
//	hookcall.go     hook calls; hookbuf.go: their body budget; identify.go: whose call it is
//	prepare.go      the decide, outbound and inject stages
//	scope.go        placeholders out of scope in a streaming body or a switched connection
//	headers.go      hop-by-hop and Egressd-* stripping, Upgrade and TE checks
//	body.go         the client's request body as the upstream reads it
//	snapshot.go     Snapshot: what one reload decides and forwards with, its upstream client
//	redecide.go     open tunnels and upgrades, decided again on every change of state
//	scrub.go        masking injected values in responses
//	ranges.go       a client's byte range on a scrubbed exchange, cut from the masked body
//	respond.go      writing responses to the client, HTTP/1 and HTTP/2
//	tunnel.go       splicing tunnels and upgrades; relay.go: the copy loop
//	refuse.go       the one error -> response function
//	record.go       Record, the canonical log line
//
// The upstream side, as net/http's Transport is to its Server, is the package
// upstream: dialling decided targets through the address guard, the HTTP/1.1 pool,
// the transports and the HTTP/2-only fallback.
package proxy
