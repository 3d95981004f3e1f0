package daemon

import (
	"context"
	"net/http"
	"net/netip"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/hooks"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/proxy"
	mitm "github.com/egressd/egressd/internal/tls"
)

// creds is one credential scope's store (behind its oauth2 token manager), kept
// across rebuilds while its backend and IDs are unchanged: the Daemon's, and each
// node-mode sandbox's.
type creds struct {
	live  liveStore         // the current store, for injectors and the signer
	store *credential.Store // nil until the first snapshot
	key   string            // storeKey of store
	stop  context.CancelFunc
}

// shared is what every Snapshot of a process is built with: egressd's own
// addresses, the CA's leaves and the hook signer.
type shared struct {
	self   []netip.AddrPort
	live   *netguard.SelfSet // a node's sandboxes' listeners outside a namespace of their own
	leaves *mitm.Leaves
	signer *hooks.Signer
	log    zerolog.Logger
	m      *metrics.Metrics
	node   *proxy.Server  // the node's own Server, whose budgets sandboxes' shares draw on
	vaults *vaultSessions // node mode's shared Vault sessions; nil in a sidecar
}

// snapshot builds the Snapshot for l, reusing the running store when the backend
// and the credential IDs are unchanged, so a rebuild keeps last good values. A new
// store replaces the running one only once the Snapshot has been built: a rebuild
// that fails leaves the store, and so the credentials served, as they were. follow,
// when not nil, is subscribed to a new store's changes.
func (c *creds) snapshot(l *Loaded, sh shared, follow func(id string)) (*proxy.Snapshot, error) {
	key := storeKey(l)
	if c.store != nil && key == c.key {
		snap, err := c.build(l, sh)
		if err != nil {
			return nil, err
		}
		c.live.p.Load().SetClientFunc(func() *http.Client { return tokenClient(l, snap) })
		return snap, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	store, tokens, err := newStore(ctx, l, sh)
	if err != nil {
		cancel()
		return nil, err
	}
	snap, err := c.build(l, sh)
	if err != nil {
		cancel()
		return nil, err
	}
	tokens.SetClientFunc(func() *http.Client { return tokenClient(l, snap) })
	tokens.StartAsync(ctx, store.FirstRead())
	c.close()
	c.store, c.key, c.stop = store, key, cancel
	c.live.p.Store(tokens)
	if follow != nil {
		store.Subscribe(follow)
	}
	return snap, nil
}

// build is buildSnapshot with the placeholder replacer (whose derivation key is
// loaded, or created, in state_dir: run writes it, check does not).
func (c *creds) build(l *Loaded, sh shared) (*proxy.Snapshot, error) {
	snap, err := buildSnapshot(l, sh.self, sh.live, sh.leaves, &c.live, sh.signer)
	if err != nil {
		return nil, err
	}
	snap.Placeholders, err = Placeholders(l, &c.live)
	return snap, err
}

// close stops the store's refreshers.
func (c *creds) close() {
	if c.stop != nil {
		c.stop()
	}
}
