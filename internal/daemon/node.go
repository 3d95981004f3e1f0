package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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
// swapped in and open tunnels are decided again), else serves the spec anew and
// closes prev. New sockets may need prev's addresses: when they cannot be opened
// beside prev's, prev is closed first.
func (h nodeHost) Serve(spec node.Spec, prev node.Sandbox) (node.Sandbox, error) {
	l := spec.(nodeSpec).l
	p, _ := prev.(*sandbox)
	if p != nil && p.sameSockets(l) {
		return p, p.update(l, h.d.shared())
	}
	sb, err := h.d.startSandbox(l)
	switch {
	case err == nil && p != nil:
		p.stop()
		return sb, nil
	case err == nil:
		return sb, nil
	case p == nil:
		return prev, err
	}
	p.stop()
	if sb, err = h.d.startSandbox(l); err != nil {
		p.unpin()
		return nil, err
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
	keep    *keep.Keeper // holds a copy of each socket for the next worker
	keys    []string     // the sockets' keys in keep
	leaves  *mitm.Leaves // pins the sandbox's hook hosts' leaves

	mu sync.Mutex // guards l and rebuilds
	l  *Loaded
}

// startSandbox builds l's Snapshot and credential store, opens its sockets inside
// its network namespace and serves them.
func (d *Daemon) startSandbox(l *Loaded) (*sandbox, error) {
	s := &sandbox{l: l, log: d.log.With().Str("sandbox", l.Sandbox).Logger(), bound: map[string]string{}, keep: d.keep}
	sh := d.shared()
	s.leaves = sh.leaves
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
	s.log.Info().Str("netns", l.Netns).Any("listeners", s.bound).Msg("sandbox serving")
	return s, nil
}

// open opens the sandbox's listeners, then its DNS guard's sockets (the TCP one
// last in lns), inside its network namespace; or takes those a previous worker
// left with the supervising parent.
func (s *sandbox) open(l *Loaded) error {
	key, err := socketKeys(l)
	if err != nil {
		return err
	}
	for _, lc := range l.Cfg.Listeners {
		ln, err := s.listen(key("listener/"+lc.Name, lc.Address.String()), l.Netns, lc.Address.String())
		if err != nil {
			return err
		}
		s.lns = append(s.lns, ln)
		s.bound[lc.Name] = ln.Addr().String()
	}
	if l.Cfg.DNS.Listen == "" {
		return nil
	}
	k := key("dns/udp", l.Cfg.DNS.Listen)
	pc, err := keep.ListenPacket(s.keep, k, func() (net.PacketConn, error) { return netns.ListenPacket(l.Netns, "udp", l.Cfg.DNS.Listen) })
	if err != nil {
		return err
	}
	s.pc, s.keys = pc, append(s.keys, k)
	ln, err := s.listen(key("dns/tcp", l.Cfg.DNS.Listen), l.Netns, pc.LocalAddr().String())
	if err != nil {
		return err
	}
	s.lns = append(s.lns, ln)
	s.bound["dns"] = pc.LocalAddr().String()
	return nil
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
// may take), the socket's role and its configured address. A socket is taken again
// only by the spec that would have opened it.
func socketKeys(l *Loaded) (func(role, address string) string, error) {
	ns := "own"
	if l.Netns != "" {
		var st unix.Stat_t
		if err := unix.Stat(l.Netns, &st); err != nil {
			return nil, fmt.Errorf("netns: %s: %w", l.Netns, err)
		}
		ns = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	}
	return func(role, address string) string {
		return strings.Join([]string{"sock", l.Sandbox, ns, role, address}, "/")
	}, nil
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
	return s.l.Netns == l.Netns && slices.Equal(cur.Listeners, l.Cfg.Listeners) && cur.DNS == l.Cfg.DNS &&
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
	if n.SandboxesDir != "" {
		go d.registry.ScanDir(n.SandboxesDir).Watch(ctx)
	}
	if d.keep != nil {
		d.registry.KeepSpecs(specKeeper{d.keep, d.log})
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

// specKeeper keeps API specs with the supervising parent (node.Keeper).
type specKeeper struct {
	k   *keep.Keeper
	log zerolog.Logger
}

const specPrefix = "spec/"

func (s specKeeper) KeepSpec(id string, data []byte) {
	if err := s.k.Put(specPrefix+id, data); err != nil {
		s.log.Warn().Err(err).Str("sandbox", id).Msg("cannot leave the spec with the supervisor: a worker restart would forget this registration")
	}
}

func (s specKeeper) ForgetSpec(id string) { s.k.Forget(specPrefix + id) }

func (s specKeeper) KeptSpecs() map[string][]byte {
	specs := map[string][]byte{}
	for _, key := range s.k.Keys(specPrefix) {
		if data, err := s.k.Data(key); err == nil {
			specs[strings.TrimPrefix(key, specPrefix)] = data
		}
	}
	return specs
}
