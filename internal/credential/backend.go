package credential

import "context"

// Backend reads credentials; a Store calls it at Start and in the background, never on the
// request path. Implementations must be safe for concurrent use.
//
// Read returns the secret of one ID (Parse's) and a version that changes whenever it does,
// or an error. Errors must never contain a secret value (name the ID, a path, a status):
//   - ErrNotFound (wrapped or not): the backend answered and the ID is not there;
//   - an error wrapping ErrInvalid (Parse's): the secret has a bad shape;
//   - an error wrapping ErrRevoked (Parse's): the secret's status is "revoked";
//   - anything else is a failed read (backend down, file unreadable, corrupt as a whole),
//     after which the Store keeps serving the last good value until MaxStale.
//
// The Store copies the returned headers; the backend may keep and share its own slice, and
// the OAuth2 and Env it points to, which nobody modifies.
type Backend interface {
	Name() string // "file", "vault": the backend field of log lines
	Read(ctx context.Context, id string) (secret Secret, version string, err error)
}

// Writer is implemented by backends that can store a changed secret (a rotated oauth2
// refresh token): Vault writes a new KV version of the same path, the file backend rewrites
// the file atomically with every other entry unchanged. Write replaces the secret of id with
// raw (a whole secret, typed fields included) if its current version is still version, and
// fails otherwise. Errors never contain a value.
type Writer interface {
	Write(ctx context.Context, id, version string, raw map[string]any) error
}

// Watcher is implemented by backends that notice changes themselves (the file backend).
// Store.Start calls Watch once; it returns at once, and until ctx ends the backend calls
// onChange on each change, from a goroutine of its own that exists only while it calls
// (never two calls at once for one Watch), and the Store re-reads every ID. A Store
// waiting for a change thus parks no goroutine.
type Watcher interface {
	Watch(ctx context.Context, onChange func())
}

// IDWatcher is implemented by backends that know when one ID must be re-read before its
// Refresh comes round: the vault backend, whose leased and short-lived secrets (Vault
// identity tokens) must be replaced before they expire, and which re-reads every ID after
// it has logged in again. Store.Start runs WatchIDs until its context ends; each
// refresh(id) re-reads that ID now and returns when the read is done, refresh("") re-reads
// every ID (Store.RefreshNow). IDs the Store does not manage are ignored.
type IDWatcher interface {
	WatchIDs(ctx context.Context, refresh func(id string))
}
