package proxy

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
)

// A spliced tunnel or an upgraded connection (WebSocket, any 101) outlives the
// decision that admitted it: no request of its own comes by to be decided again. So
// each one is registered while it is open, with what it was admitted for, and every
// change of state decides the open ones again with their admission's own checks and
// ends those the new state refuses: Swap (a reload) all of them, CredentialChanged
// those carrying the credential. Requests inside intercepted tunnels need none of
// this: each is decided on the Snapshot current when it arrives.

// detailPolicyReload is the detail of an open tunnel or upgraded connection ended
// because the state changed under it: after a reload, a policy change or a
// credential revocation, the new state refuses it (docs/reasons.md).
const detailPolicyReload = "policy_reload"

// openConn is one open spliced tunnel or upgraded connection.
type openConn struct {
	target allowlist.Target
	// scheme is DecideRequest's: "" for a tunnel, the request's for an upgrade
	// (a plain-http upgrade is refused where the entry injects).
	scheme string
	// sniless marks a transparent tunnel without SNI: its target is the original
	// destination, which only an entry naming the address allows (namesAddress).
	sniless bool
	// upstream is the address dialled, which the address guard judges again;
	// invalid when unknown.
	upstream netip.AddrPort
	// credential is the ID whose value an upgrade carries; "" for none.
	credential string
	// close closes both sides; the connection's goroutine then logs its Record.
	close func()
	// cut is why the connection was ended, set once, before close.
	cut atomic.Pointer[refusal]
}

// decide decides o again on snap, with the checks that admitted it: the policy on its
// target and port (and scheme), an entry naming the address for a tunnel without
// SNI, the address guard on the address dialled, and the credential it carries. It
// returns the refusal, with detail policy_reload, or nil to keep o.
func (o *openConn) decide(snap *Snapshot) *refusal {
	d := snap.Policy.DecideRequest(o.target, o.scheme)
	switch {
	case !d.Allowed():
		return changed(deny(d.Reason, ""))
	case o.sniless && !namesAddress(d):
		return changed(deny(allowlist.ReasonNotAllowlisted, ""))
	}
	if o.upstream.IsValid() {
		if err := snap.Guard.Check(o.upstream); err != nil {
			return changed(classify(err))
		}
	}
	if o.credential != "" {
		if err := snap.credentialError(o.credential); err != nil {
			return changed(classify(err))
		}
	}
	return nil
}

// changed is rf as the refusal of a connection the state changed under.
func changed(rf *refusal) *refusal {
	return &refusal{Reason: rf.Reason, Detail: detailPolicyReload, Err: rf.Err}
}

// end records why o ends and closes it; only the first end counts. Closing runs
// apart, so that no peer that reads nothing can hold the change of state up (a TLS
// close_notify may wait for it).
func (o *openConn) end(rf *refusal) {
	if o.cut.CompareAndSwap(nil, rf) {
		go o.close()
	}
}

// ended writes on rec why o was ended, if it was: the new state's reason, detail
// policy_reload. Call it once both directions are done.
func (o *openConn) ended(rec *Record) {
	if rf := o.cut.Load(); rf != nil {
		rec.refused(rf)
	}
}

// namesAddress reports whether d allows its target by an entry that names it, not
// by "*": what a transparent ClientHello without SNI needs, whose target is only
// the original destination address.
func namesAddress(d allowlist.Decision) bool { return d.Allowed() && d.Rule.Pattern != "*" }

// credentialError is why credential id cannot be served on snap now, or nil.
func (snap *Snapshot) credentialError(id string) error {
	creds := snap.Injector.Credentials()
	if creds == nil {
		return &credential.UnavailableError{ID: id, Cause: credential.CauseNeverRead}
	}
	_, err := creds.Get(id)
	return err
}

// upstreamAddr is the address a connection reached, from its net.Addr, or invalid.
func upstreamAddr(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}

// resolvedAddr is the address an upgrade's request was sent to: the IP the record
// names on the target's port, or invalid when it names none.
func resolvedAddr(rec *Record, port uint16) netip.AddrPort {
	ip, err := netip.ParseAddr(rec.ResolvedIP)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip, port)
}

// register keeps o among the open connections until unregister, and decides it at
// once on the current Snapshot: a Swap or a revocation between its admission and now
// did not see it. Either that pass sees o, or o sees what that pass installed.
func (s *Server) register(o *openConn) {
	s.live.add(o)
	if rf := o.decide(s.Snapshot()); rf != nil {
		o.end(rf)
	}
}

func (s *Server) unregister(o *openConn) { s.live.remove(o) }

// redecide decides every open connection again on snap and ends those it refuses.
// It returns how many were open and how many it ended.
func (s *Server) redecide(snap *Snapshot) (open, ended int) {
	all := s.live.list("")
	for _, o := range all {
		if rf := o.decide(snap); rf != nil {
			o.end(rf)
			ended++
		}
	}
	return len(all), ended
}

// CredentialChanged ends the open upgraded connections that carry credential id
// when it can no longer be served (revoked, removed, stale): they are refused as a
// new request would be (credential_unavailable, detail policy_reload). The
// credential store calls it after every read of id (credential.Store.Subscribe);
// a credential that can be served costs one lookup.
func (s *Server) CredentialChanged(id string) {
	err := s.Snapshot().credentialError(id)
	if err == nil {
		return
	}
	rf := changed(classify(err))
	for _, o := range s.live.list(id) {
		o.end(rf)
	}
}

// openSet is the Server's open tunnels and upgraded connections.
type openSet struct {
	mu sync.Mutex
	m  map[*openConn]struct{}
}

func (s *openSet) add(o *openConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*openConn]struct{}{}
	}
	s.m[o] = struct{}{}
}

func (s *openSet) remove(o *openConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, o)
}

// list returns the open connections that carry credential id, or all when id is "".
func (s *openSet) list(id string) []*openConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*openConn, 0, len(s.m))
	for o := range s.m {
		if id == "" || o.credential == id {
			out = append(out, o)
		}
	}
	return out
}

func (s *openSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}
