// Package file is egressd's embedded credential backend: a JSON file of credential ID ->
// secret, re-read when it changes. It parses the file once per change, not once per ID.
//
// Invariant: errors name the file, a byte offset or an ID, never content: a corrupt file's
// bytes may be secrets.
package file

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/credential"
)

// Defaults and bounds of the file backend.
const (
	// DefaultPollInterval is how often Watch stats the file; a change is noticed within it.
	DefaultPollInterval = time.Second
	// hashEvery: every this many polls Watch re-reads and hashes the file even when its stat
	// is unchanged, to catch writes that keep size, mtime and inode (cp -p over the file).
	hashEvery = 10
	// racyWindow: a file modified less than this before it was read may change again
	// without its stat showing it (mtimes are coarse on some filesystems: 1s, 2s on FAT),
	// so until the window has passed its content is re-hashed on every load.
	racyWindow = 2 * time.Second
	// maxFileBytes bounds the file: larger is a failed read, not an allocation.
	maxFileBytes = 4 << 20
)

// Options configure a Backend; zero values take the defaults.
type Options struct {
	PollInterval time.Duration  // default DefaultPollInterval (1s)
	Log          zerolog.Logger // the world-readable warning; the zero Logger discards it
}

// Backend reads credentials from a JSON file: {"<credential ID>": <secret shape>, ...}.
// A file that cannot be read or is not a JSON object is a failed read for every ID; a file
// that parses but lacks an ID gives credential.ErrNotFound for it; an ID whose secret has a
// bad shape gives an error wrapping credential.ErrInvalid for that ID only.
// Versions are "hmac:" and 16 hex digits of an HMAC-SHA256, under a random per-process
// key, of the secret's canonical JSON (keys sorted): they change when the secret does and
// are stable for the process's life, but cannot be checked against guesses offline.
type Backend struct {
	path   string
	o      Options
	mu     sync.Mutex // guards snap and serialises loads
	snap   *snapshot  // the last load; nil before the first
	warned atomic.Bool
	probe  bool // a poller's (poll.go): the content is hashed, never parsed nor kept
}

var (
	_ credential.Backend = (*Backend)(nil)
	_ credential.Watcher = (*Backend)(nil)
)

// New returns a Backend for the file at path (symlinks followed: Kubernetes ConfigMap and
// Secret volumes swap a symlink). Nothing is read until the first Read or Watch poll.
func New(path string, o Options) *Backend {
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	return &Backend{path: path, o: o}
}

// Name is "file".
func (b *Backend) Name() string { return "file" }

// Read returns the secret and version of id from the cached parse of the file, re-reading
// the file first if its stat changed.
func (b *Backend) Read(ctx context.Context, id string) (credential.Secret, string, error) {
	if err := ctx.Err(); err != nil {
		return credential.Secret{}, "", err
	}
	snap := b.load(false)
	if snap.err != nil {
		return credential.Secret{}, "", snap.err
	}
	e, ok := snap.entries[id]
	switch {
	case !ok:
		return credential.Secret{}, "", fmt.Errorf("%w in credentials file %s", credential.ErrNotFound, b.path)
	case e.err != nil:
		return credential.Secret{}, "", e.err
	}
	return e.secret, e.version, nil
}

// Watch polls the file every PollInterval until ctx ends and calls onChange whenever its
// content or its failure changes: a rewrite, a rename over it, a symlink swap, a deletion,
// a restore. The first poll always calls onChange once. Watch returns at once; onChange
// runs on a goroutine that lives only while the file is looked at, never two at once.
// Backends watching the same path share one poll of it (poll.go).
func (b *Backend) Watch(ctx context.Context, onChange func()) {
	var seen uint64 // only the look in progress touches it
	leave := join(pollKey{path: b.path, every: b.o.PollInterval}, func(force bool) {
		if snap := b.load(force); snap.gen != seen {
			seen = snap.gen
			onChange()
		}
	})
	context.AfterFunc(ctx, leave)
}

// Inspection is what `egressd check` learns from the credentials file, as the
// backend would read it: the IDs it holds, the ones whose secret is bad, and
// whether every user can read it.
type Inspection struct {
	IDs           []string         // every credential ID in the file, sorted
	Bad           map[string]error // ID -> why its secret cannot be served
	WorldReadable bool             // mode has o+r: `run` warns about it too
}

// Inspect reads and parses the file at path as Read would. Bad holds the problem of
// every entry whose secret is bad or revoked; the error is a failure of the whole
// file. Messages name the ID, the field and the fix, never a value (egressd check
// prints them).
func Inspect(path string) (Inspection, error) {
	in := Inspection{Bad: map[string]error{}}
	if fi, err := os.Stat(path); err == nil {
		in.WorldReadable = fi.Mode().Perm()&0o004 != 0
	}
	data, err := readFile(path)
	if err != nil {
		return in, err
	}
	entries, err := parse(path, data)
	if err != nil {
		return in, err
	}
	for id, e := range entries {
		in.IDs = append(in.IDs, id)
		if e.err != nil {
			in.Bad[id] = e.err
		}
	}
	slices.Sort(in.IDs)
	return in, nil
}
