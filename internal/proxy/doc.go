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
//	server.go       Server, listeners, accept, Swap, Shutdown (drain)
//	slots.go        connection slots at limits.max_connections: evicting the longest wait
//	lane.go         the hook lane: slots kept for pre-tool hook calls
//	connmem.go      what each connection holds of the memory budget; memory.go: the budget's shares, HTTP/2 windows
//	conn.go         one client connection: the request loop, handle, refusal writing
//	mode.go         the connection's mode (route), and planTunnel: what a tunnel becomes
//	head.go         the bounded request head and its framing checks
//	deadline.go     client read and write deadlines
//	connect.go      CONNECT: decide, dial, 200, ClientHello check, splice or intercept
//	transparent.go  the transparent listener: original destination, SNI decision
//	tlspeek.go      reading the ClientHello without consuming it
//	intercept.go    terminating the client's TLS in an intercepted tunnel
//	h1.go           the HTTP/1.x client side of a request (h1Side)
//	h2.go           HTTP/2 inside an intercepted tunnel, its client side (h2Side)
//	pipeline.go     the request path in one screen, and the one request tail
//	target.go       the target stage: the request's target, by connection mode
//	hookcall.go     hook calls; hookbuf.go: their body budget; identify.go: whose call it is
//	prepare.go      decide and prepare the outbound request (strip, inject, placeholders)
//	scope.go        placeholders out of scope in a streaming body or a switched connection
//	headers.go      hop-by-hop and Egressd-* stripping, Upgrade and TE checks
//	body.go         the client's request body as the upstream reads it
//	forward.go      the round trip to the upstream
//	h1pool.go       h1Pool, the upstream HTTP/1.1 pool for bodiless GET/HEAD
//	h2only.go       an HTTP/1 client's request again over HTTP/2 to an HTTP/2-only upstream
//	dial.go         resolve, check and dial the decided target
//	snapshot.go     Snapshot: what one reload decides and forwards with, its transports
//	redecide.go     open tunnels and upgrades, decided again on every change of state
//	scrub.go        masking injected values in responses
//	respond.go      writing responses to the client, HTTP/1 and HTTP/2
//	tunnel.go       splicing tunnels and upgrades; relay.go: the copy loop
//	refuse.go       the one error -> response function
//	record.go       Record, the canonical log line
package proxy
