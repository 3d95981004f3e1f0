package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/keep"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/netns"
	"github.com/egressd/egressd/internal/node"
	"github.com/egressd/egressd/internal/proxy"
	mitm "github.com/egressd/egressd/internal/tls"
)

// Node mode: the Daemon is the registry's Host. Each sandbox is served by a
// proxy.Server of its own, over its own Snapshot and credential store, built by the
// same functions as the Daemon's own (creds.snapshot), sharing the CA's leaves, the
// hook signer and egressd's own addresses. Its listeners and DNS guard are opened
// inside its network namespace (internal/netns), so the listener a connection
// arrived on is its sandbox.

// nodeSpec is a validated sandbox spec.
type nodeSpec struct{ l *Loaded }

func (s nodeSpec) ID() string   { return s.l.Sandbox }
func (s nodeSpec) Hash() string { return s.l.Cfg.Hash }

// nodeHost validates specs against the node's config in force and serves them.
type nodeHost struct{ d *Daemon }

func (h nodeHost) Load(id string, data []byte, baseDir string) (node.Spec, []config.Problem) {
	h.d.mu.Lock()
	cur := h.d.current
	h.d.mu.Unlock()
	l, problems := LoadSandbox(cur, id, data, baseDir)
	if l == nil {
		return nil, problems
	}
	return nodeSpec{l}, problems
}

// Serve changes prev in place when the spec keeps its sockets (the new Snapshot is
// swapped in and open tunnels are decided again), else serves the spec anew, on the
// sockets of prev's it names again (package keep hands them over), and stops prev.
// When the new spec cannot be served, prev goes on serving as it was: its sockets
// are never closed before its successor serves, so a sandbox's port is never free
// for a process inside it to bind.
func (h nodeHost) Serve(spec node.Spec, prev node.Sandbox) (node.Sandbox, error) {
	l := spec.(nodeSpec).l
	p, _ := prev.(*sandbox)
	if p != nil && p.sameSockets(l) {
		return p, p.update(l, h.d.shared())
	}
	sb, err := h.d.startSandbox(l)
	switch {
	case err != nil && p != nil:
		p.repin() // the failed start unpinned the sandbox's hook hosts
		return prev, err
	case err != nil:
		return prev, err
	case p != nil:
		p.stop()
	}
	return sb, nil
}

// sandbox is one sandbox being served.
type sandbox struct {
	log     zerolog.Logger // carries the sandbox's ID
	srv     *proxy.Server
	creds   creds
	lns     []net.Listener
	pc      net.PacketConn
	bound   map[string]string
	stopDNS context.CancelFunc
	keep    *keep.Keeper      // holds a copy of each socket for the next worker
	keys    []string          // the sockets' keys in keep
	leaves  *mitm.Leaves      // pins the sandbox's hook hosts' leaves
	live    *netguard.SelfSet // the node's own addresses, which the listeners join (markSelf)
	marked  bool              // the listeners are in live
	ns      string            // the identity of the namespace the sockets are in (nsIdentity)

	mu sync.Mutex // guards l and rebuilds
	l  *Loaded
}

// startSandbox builds l's Snapshot and credential store, opens its sockets inside
// its network namespace and serves them.
func (d *Daemon) startSandbox(l *Loaded) (*sandbox, error) {
	s := &sandbox{l: l, log: d.log.With().Str("sandbox", l.Sandbox).Logger(), bound: map[string]string{}, keep: d.keep}
	sh := d.shared()
	s.leaves, s.live = sh.leaves, sh.live
	sh.log = s.log
	snap, err := s.creds.snapshot(l, sh, nil)
	if err != nil {
		return nil, err
	}
	if err := s.open(l); err != nil {
		s.closeSockets()
		s.release()
		s.unpin()
		s.creds.close()
		snap.Close()
		return nil, err
	}
	// The Server logs with the node's logger: its records carry the sandbox in a field of their own.
	shareLimits(snap, sh.node, l.Share)
	s.srv = proxy.NewShare(sh.node, snap, d.log, d.metrics)
	s.creds.store.Subscribe(s.srv.CredentialChanged)
	for i, lc := range l.Cfg.Listeners {
		go s.serve(s.lns[i], lc)
	}
	if s.pc != nil {
		// The guard's end is its own business: it ends when the sandbox does.
		if s.stopDNS, err = startDNS(l, s.srv, s.pc, s.lns[len(l.Cfg.Listeners)], s.log, make(chan error, 1)); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.markSelf(true)
	s.log.Info().Str("netns", l.Netns).Any("listeners", s.bound).Msg("sandbox serving")
	return s, nil
}

// open opens the sandbox's listeners, then its DNS guard's sockets (the TCP one
// last in lns), inside its network namespace; or takes those a previous worker
// left with the supervising parent.
func (s *sandbox) open(l *Loaded) error {
	key, ns, err := socketKeys(l)
	if err != nil {
		return err
	}
	s.ns = ns
	for _, lc := range l.Cfg.Listeners {
		ln, err := s.listen(key("tcp", lc.Name, lc.Address.String()), l.Netns, lc.Address.String())
		if err != nil {
			return err
		}
		s.lns = append(s.lns, ln)
		if s.lns[len(s.lns)-1], err = admitPeers(ln, l.Netns, lc, s.log); err != nil {
			return err
		}
		s.bound[lc.Name] = ln.Addr().String()
	}
	if l.Cfg.DNS.Listen == "" {
		return nil
	}
	k := key("udp", "dns", l.Cfg.DNS.Listen)
	pc, err := keep.ListenPacket(s.keep, k, func() (net.PacketConn, error) { return netns.ListenPacket(l.Netns, "udp", l.Cfg.DNS.Listen) })
	if err != nil {
		return err
	}
	s.pc, s.keys = pc, append(s.keys, k)
	ln, err := s.listen(key("tcp", "dns", l.Cfg.DNS.Listen), l.Netns, pc.LocalAddr().String())
	if err != nil {
		return err
	}
	s.lns = append(s.lns, ln)
	s.bound["dns"] = pc.LocalAddr().String()
	return nil
}

// markSelf adds (or, with add false, removes) the sandbox's bound listeners to
// the node's own addresses, which no sandbox's request may reach, when they are
// in egressd's own namespace: no sandbox may have egressd connect it to another's
// listener. Inside a namespace of its own, no address egressd dials reaches them.
func (s *sandbox) markSelf(add bool) {
	if s.live == nil || s.l.Netns != "" || s.marked == add {
		return
	}
	s.marked = add
	for _, ln := range s.lns {
		ap, ok := ln.Addr().(*net.TCPAddr)
		if !ok {
			continue
		}
		if add {
			s.live.Add(ap.AddrPort())
		} else {
			s.live.Remove(ap.AddrPort())
		}
	}
}

// listen opens (or takes) a TCP listener on address inside netnsPath.
func (s *sandbox) listen(key, netnsPath, address string) (net.Listener, error) {
	ln, err := keep.Listen(s.keep, key, func() (net.Listener, error) { return netns.Listen(netnsPath, "tcp", address) })
	if err == nil {
		s.keys = append(s.keys, key)
	}
	return ln, err
}

// socketKeys returns the function that names each of l's sockets in keep: the
// sandbox, the identity of its namespace (not only its path, which a new namespace
// may take), the network and the configured address; for an address with port 0
// (any free port), the socket's name instead, since no two such sockets are one.
// A spec that renames a listener, changes its mode or moves the DNS guard's TCP
// socket to a listener keeps the very socket: no moment in which the port is
// free for a process in the sandbox to bind.
func socketKeys(l *Loaded) (key func(network, name, address string) string, ns string, err error) {
	if ns, err = nsIdentity(l.Netns); err != nil {
		return nil, "", err
	}
	return func(network, name, address string) string {
		if ap, err := netip.ParseAddrPort(address); err != nil || ap.Port() != 0 {
			name = ""
		}
		return strings.Join([]string{"sock", l.Sandbox, ns, network, address, name}, "/")
	}, ns, nil
}

// nsChanged reports whether the sandbox's namespace path now names another
// namespace than the one its sockets are in (deleted and made again, as a
// sandbox restarted by its platform is): a path that is gone is no change.
func (s *sandbox) nsChanged() bool {
	s.mu.Lock()
	path := s.l.Netns
	s.mu.Unlock()
	if path == "" {
		return false
	}
	ns, err := nsIdentity(path)
	return err == nil && ns != s.ns
}

// nsIdentity is the identity of the network namespace at path (its nsfs device
// and inode), "own" for egressd's own.
func nsIdentity(path string) (string, error) {
	if path == "" {
		return "own", nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("netns: %s: %w", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil
}

// release lets go of the copies of the sandbox's sockets the parent keeps: the
// sandbox is removed, or serves other sockets now.
func (s *sandbox) release() {
	for _, k := range s.keys {
		s.keep.Release(k)
	}
	s.keys = nil
}

func (s *sandbox) closeSockets() {
	for _, ln := range s.lns {
		ln.Close()
	}
	if s.pc != nil {
		s.pc.Close()
	}
}

// serve serves ln until the sandbox closes; a listener that fails is logged and
// the others go on serving.
func (s *sandbox) serve(ln net.Listener, lc config.Listener) {
	if err := s.srv.Serve(ln, lc); err != nil && !errors.Is(err, net.ErrClosed) {
		s.log.Error().Err(err).Str("listener", lc.Name).Msg("sandbox listener failed")
	}
}

// sameSockets reports whether l serves the sockets s has open, so that l can be
// swapped in without closing them.
func (s *sandbox) sameSockets(l *Loaded) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.l.Cfg
	ns, err := nsIdentity(l.Netns)
	return err == nil && ns == s.ns && slices.EqualFunc(cur.Listeners, l.Cfg.Listeners, config.Listener.Equal) && cur.DNS == l.Cfg.DNS &&
		cur.Limits.MaxConnections == l.Cfg.Limits.MaxConnections
}

// update swaps in l's Snapshot: requests in flight finish on the old one, open
// tunnels and upgraded connections are decided again (policy_reload).
func (s *sandbox) update(l *Loaded, sh shared) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh.log = s.log
	snap, err := s.creds.snapshot(l, sh, s.srv.CredentialChanged)
	if err != nil {
		return err
	}
	shareLimits(snap, sh.node, l.Share)
	old := s.srv.Swap(snap)
	s.l = l
	old.Close()
	time.AfterFunc(drainTimeout, old.Close)
	return nil
}

// Close removes the sandbox: stop, and its hook hosts' leaves are no longer
// pinned for it.
func (s *sandbox) Close() {
	s.stop()
	s.unpin()
}

// stop stops the sandbox's listeners and DNS guard and closes every connection it
// holds at once: a removed or replaced sandbox is not drained. Its sockets close
// with it, unless its replacement serves them.
func (s *sandbox) stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Drain(ctx)
	s.release()
}

// repin pins the hook hosts of the Snapshot the sandbox serves, for its ID.
func (s *sandbox) repin() {
	if err := pinHookLeaves(s.leaves, s.l.Sandbox, s.srv.Snapshot().Hooks); err != nil {
		s.log.Warn().Err(err).Msg("hook hosts' leaves")
	}
}

// unpin lets go of the pins of the sandbox's hook hosts' leaves (its ID's: a
// replacement pins under the same ID before the sandbox it replaces stops).
func (s *sandbox) unpin() {
	if s.leaves != nil {
		s.leaves.PinFor(s.l.Sandbox, nil)
	}
}

// Drain stops the sandbox's listeners and DNS guard, lets requests in flight finish
// until ctx ends (egressd's SIGTERM), then closes what is left. The copies of its
// sockets the parent keeps stay: a worker that drains is stopping or being
// upgraded, and the parent closes them when egressd stops.
func (s *sandbox) Drain(ctx context.Context) {
	if s.stopDNS != nil {
		s.stopDNS()
	}
	s.closeSockets()
	s.markSelf(false)
	if s.srv != nil {
		s.srv.Shutdown(ctx)
		s.srv.Snapshot().Close()
	}
	s.creds.close()
	s.log.Info().Msg("sandbox stopped")
}

// Status is the sandbox's figures for GET /v1/sandboxes/{id}.
func (s *sandbox) Status() node.Status {
	t := s.srv.Tally()
	s.mu.Lock()
	netnsPath := s.l.Netns
	s.mu.Unlock()
	env := map[string]string{}
	if ph := s.srv.Snapshot().Placeholders; ph != nil {
		env = ph.Env()
	}
	return node.Status{
		Env:         env,
		Requests:    map[string]int64{"allow": t.Allow.Load(), "deny": t.Deny.Load(), "error": t.Error.Load()},
		Open:        s.srv.Open(),
		Credentials: s.creds.store.Status(),
		Listeners:   s.bound,
		Netns:       netnsPath,
		Memory:      shareStatus(s.srv),
	}
}

// startNode starts node mode when the config has it: the registry, the watcher of
// node.sandboxes_dir and the API on node.api_socket. Node mode's settings are read
// at start only. Under a supervisor, the sandboxes a previous worker served are
// served again before the API answers: those of the directory, and those
// registered through the API, on the sockets the parent kept.
func (d *Daemon) startNode(n config.Node) error {
	if !n.Enabled() {
		return nil
	}
	d.registry = node.New(nodeHost{d}, n.MaxSandboxes, d.log)
	ctx, cancel := context.WithCancel(context.Background())
	d.vaults = newVaultSessions(ctx, d.log)
	if err := d.keep.Take(); err != nil {
		d.log.Warn().Err(err).Msg("cannot take back what the previous worker left with the supervisor: sandboxes' sockets are opened anew")
	}
	ln, err := d.nodeAPISocket(n.APISocket)
	if err != nil {
		cancel()
		return err
	}
	if d.keep != nil {
		d.registry.KeepSpecs(specKeeper{d.keep, d.log})
	}
	if n.SandboxesDir != "" {
		go d.registry.ScanDir(n.SandboxesDir).Watch(ctx)
	}
	// A namespace made anew at a sandbox's path has none of its sockets: until it
	// is served, a process in it could bind the ports its traffic is sent to.
	go d.registry.RenewEvery(ctx, func(sb node.Sandbox) bool { return sb.(*sandbox).nsChanged() })
	if d.keep != nil {
		d.registry.Restore()
		if gone := d.keep.Prune(); len(gone) > 0 {
			d.log.Info().Int("released", len(gone)).Msg("let go of what the previous worker left for sandboxes no longer registered")
		}
	}
	var api *http.Server
	if ln != nil {
		api = &http.Server{Handler: d.registry.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go api.Serve(ln)
	}
	d.stopNode = func(ctx context.Context) {
		cancel()
		if api != nil {
			api.Close()
		}
		d.registry.Drain(ctx)
		d.keep.Close()
	}
	return nil
}

// nodeAPISocket opens node.api_socket (nil for none), or takes the one the
// supervisor kept: requests made while a worker restarts wait in its backlog.
func (d *Daemon) nodeAPISocket(path string) (net.Listener, error) {
	if path == "" {
		return nil, nil
	}
	ln, err := keep.Listen(d.keep, "api/"+path, func() (net.Listener, error) { return node.ListenSocket(path) })
	if err != nil {
		return nil, err
	}
	if ul, ok := ln.(*net.UnixListener); ok && d.keep != nil {
		ul.SetUnlinkOnClose(false) // the socket outlives this worker; the path must too
	}
	if fi, err := os.Stat(filepath.Dir(path)); err == nil && fi.Mode().Perm()&0o077 != 0 {
		d.log.Warn().Str("dir", filepath.Dir(path)).Str("mode", fi.Mode().Perm().String()).
			Msg("node.api_socket's directory is open to other users: make it 0700, so no sandbox can reach the socket's path")
	}
	d.log.Info().Str("listener", "node_api").Str("address", path).Msg("listening")
	return ln, nil
}

// specKeeper keeps the specs in force with the supervising parent (node.Keeper),
// each as JSON in a memory file the parent holds without reading.
type specKeeper struct {
	k   *keep.Keeper
	log zerolog.Logger
}

const specPrefix = "spec/"

func (s specKeeper) KeepSpec(id string, k node.Kept) {
	data, err := json.Marshal(k)
	if err == nil {
		err = s.k.Put(specPrefix+id, data)
	}
	if err != nil {
		s.log.Warn().Err(err).Str("sandbox", id).Msg("cannot leave the spec with the supervisor: a worker restart would forget this registration")
	}
}

func (s specKeeper) ForgetSpec(id string) { s.k.Forget(specPrefix + id) }

func (s specKeeper) KeptSpecs() map[string]node.Kept {
	specs := map[string]node.Kept{}
	for _, key := range s.k.Keys(specPrefix) {
		var k node.Kept
		data, err := s.k.Data(key)
		if err == nil && json.Unmarshal(data, &k) == nil {
			specs[strings.TrimPrefix(key, specPrefix)] = k
		}
	}
	return specs
}
