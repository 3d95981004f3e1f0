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
// whole path; pipeline.go shows each path on one screen):
//
//	server.go    Server, Swap, Shutdown, and admission: accept, connection slots at
//	             limits.max_connections, the hook lane, what a connection holds of the
//	             memory budget, the budget's shares and HTTP/2 windows, deadlines
//	conn.go      one client connection and HTTP/1.x on it: its mode (route), the request
//	             loop, the bounded request head, the client side (h1Side), writing
//	             responses and refusals
//	tunnel.go    tunnels, CONNECT and transparent TLS: decideTunnel and planTunnel, the
//	             ClientHello, interception, splicing and its copy loop, open tunnels
//	             decided again on every change of state
//	h2.go        HTTP/2 inside an intercepted tunnel, its client side (h2Side)
//	pipeline.go  each path on one screen, and the one request tail, exchange.serve, with
//	             its stages: target, decide, outbound, inject, forward; hop-by-hop
//	             stripping, the request body and its read deadline, what a request
//	             holds of the memory budget, placeholders out of scope
//	hookcall.go  hook calls: answered by egressd, their body budget, whose call it is
//	scrub.go     masking injected values in responses; a client's byte range cut from
//	             the masked body
//	refuse.go    the one error -> response function
//	record.go    Record, the canonical log line
//	snapshot.go  Snapshot: what one reload decides and forwards with, its upstream client
//
// The upstream side, as net/http's Transport is to its Server, is the package
// upstream: dialling decided targets through the address guard, the HTTP/1.1 pool,
// the transports and the HTTP/2-only fallback.
package proxy
