package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/netns"
	"github.com/egressd/egressd/internal/node"
	"github.com/egressd/egressd/internal/proxy"
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
		p.Close()
		return sb, nil
	case err == nil:
		return sb, nil
	case p == nil:
		return prev, err
	}
	p.Close()
	if sb, err = h.d.startSandbox(l); err != nil {
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

	mu sync.Mutex // guards l and rebuilds
	l  *Loaded
}

// startSandbox builds l's Snapshot and credential store, opens its sockets inside
// its network namespace and serves them.
func (d *Daemon) startSandbox(l *Loaded) (*sandbox, error) {
	s := &sandbox{l: l, log: d.log.With().Str("sandbox", l.Sandbox).Logger(), bound: map[string]string{}}
	sh := d.shared()
	sh.log = s.log
	snap, err := s.creds.snapshot(l, sh, nil)
	if err != nil {
		return nil, err
	}
	if err := s.open(l); err != nil {
		s.closeSockets()
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
// last in lns), inside its network namespace.
func (s *sandbox) open(l *Loaded) error {
	for _, lc := range l.Cfg.Listeners {
		ln, err := netns.Listen(l.Netns, "tcp", lc.Address.String())
		if err != nil {
			return err
		}
		s.lns = append(s.lns, ln)
		s.bound[lc.Name] = ln.Addr().String()
	}
	if l.Cfg.DNS.Listen == "" {
		return nil
	}
	pc, err := netns.ListenPacket(l.Netns, "udp", l.Cfg.DNS.Listen)
	if err != nil {
		return err
	}
	s.pc = pc
	ln, err := netns.Listen(l.Netns, "tcp", pc.LocalAddr().String())
	if err != nil {
		return err
	}
	s.lns = append(s.lns, ln)
	s.bound["dns"] = pc.LocalAddr().String()
	return nil
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

// Close stops the sandbox's listeners and DNS guard and closes every connection it
// holds at once: a removed sandbox is not drained.
func (s *sandbox) Close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Drain(ctx)
}

// Drain stops the sandbox's listeners and DNS guard, lets requests in flight finish
// until ctx ends (egressd's SIGTERM), then closes what is left.
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
// at start only.
func (d *Daemon) startNode(n config.Node) error {
	if !n.Enabled() {
		return nil
	}
	d.registry = node.New(nodeHost{d}, n.MaxSandboxes, d.log)
	ctx, cancel := context.WithCancel(context.Background())
	d.vaults = newVaultSessions(ctx, d.log)
	var api *http.Server
	if n.APISocket != "" {
		ln, err := node.ListenSocket(n.APISocket)
		if err != nil {
			cancel()
			return err
		}
		if fi, err := os.Stat(filepath.Dir(n.APISocket)); err == nil && fi.Mode().Perm()&0o077 != 0 {
			d.log.Warn().Str("dir", filepath.Dir(n.APISocket)).Str("mode", fi.Mode().Perm().String()).
				Msg("node.api_socket's directory is open to other users: make it 0700, so no sandbox can reach the socket's path")
		}
		api = &http.Server{Handler: d.registry.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go api.Serve(ln)
		d.log.Info().Str("listener", "node_api").Str("address", n.APISocket).Msg("listening")
	}
	if n.SandboxesDir != "" {
		go d.registry.WatchDir(ctx, n.SandboxesDir)
	}
	d.stopNode = func(ctx context.Context) {
		cancel()
		if api != nil {
			api.Close()
		}
		d.registry.Drain(ctx)
	}
	return nil
}
