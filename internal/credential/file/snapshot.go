package file

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/jsonnode"
)

// versionLen is the number of hex digits of the sha256 kept as a version.
const versionLen = 16

// snapshot is one load of the file; immutable once stored.
type snapshot struct {
	key     statKey // of the file read; zero when stat failed
	readAt  time.Time
	read    bool     // the content was read (hash is valid)
	hash    [32]byte // of the content
	gen     uint64   // bumped whenever the content or the failure changes
	entries map[string]entry
	err     error   // the whole file failed: every Read returns it
	parsed  *parsed // what entries and err came from; keeps the shared parse alive
}

// entry is one credential of the file.
type entry struct {
	secret  credential.Secret
	version string
	err     error // the secret's shape is bad (wraps credential.ErrInvalid)
}

// statKey is what a change of the file changes: size, mtime, inode and device.
type statKey struct {
	size, mtime int64
	ino, dev    uint64
}

func keyOf(fi fs.FileInfo) statKey {
	ino, dev := inode(fi)
	return statKey{size: fi.Size(), mtime: fi.ModTime().UnixNano(), ino: ino, dev: dev}
}

// load returns the current snapshot, re-reading the file when its stat changed, when the
// last read was racy, or when force is set; the content is re-parsed only when its hash
// changed.
func (b *Backend) load(force bool) *snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	fi, err := os.Stat(b.path) // follows symlinks: a ConfigMap swap changes the inode
	if err != nil {
		return b.store(b.failed(err))
	}
	b.checkMode(fi)
	key, cur := keyOf(fi), b.snap
	if cur != nil && cur.read && !force && cur.key == key && cur.readAt.Sub(fi.ModTime()) >= racyWindow {
		return cur
	}
	now := time.Now()
	data, err := readFile(b.path)
	if err != nil {
		return b.store(b.failed(err))
	}
	next := &snapshot{key: key, readAt: now, read: true, hash: sha256.Sum256(data)}
	if cur != nil && cur.read && cur.hash == next.hash {
		next.gen, next.entries, next.err = cur.gen, cur.entries, cur.err
		return b.store(next)
	}
	next.gen = b.nextGen()
	if b.probe {
		return b.store(next)
	}
	next.parsed = parseShared(b.path, next.hash, data)
	next.entries, next.err = next.parsed.entries, next.parsed.err
	return b.store(next)
}

// failed is the snapshot of a file that could not be stat'ed or read; it keeps the
// generation when the failure is the same as before, so Watch reports it once.
func (b *Backend) failed(err error) *snapshot {
	if cur := b.snap; cur != nil && !cur.read && cur.err.Error() == err.Error() {
		return cur
	}
	return &snapshot{readAt: time.Now(), gen: b.nextGen(), err: err}
}

func (b *Backend) nextGen() uint64 {
	if b.snap == nil {
		return 1
	}
	return b.snap.gen + 1
}

func (b *Backend) store(s *snapshot) *snapshot {
	b.snap = s
	return s
}

// checkMode warns, once, when the file is readable by every user.
func (b *Backend) checkMode(fi fs.FileInfo) {
	if fi.Mode().Perm()&0o004 != 0 && b.warned.CompareAndSwap(false, true) {
		b.o.Log.Warn().Str("path", b.path).Str("mode", fi.Mode().Perm().String()).
			Msg("credentials file is readable by every user; chmod o-r it (or set defaultMode 0440 on the volume)")
	}
}

// readFile reads at most maxFileBytes of path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("credentials file %s: larger than %d bytes", path, maxFileBytes)
	}
	return data, nil
}

// parsed is one parse of a credentials file's content. Every Backend that reads
// the same content at the same path shares it (a node's sandboxes each have a
// Backend of the node's file, and a parse holds every entry's secret, keys
// included): it is never changed once made.
type parsed struct {
	entries map[string]entry
	err     error
}

// parseKey is a file's path and its content's hash.
type parseKey struct {
	path string
	hash [32]byte
}

// parses holds the parses that some snapshot still holds, weakly: a parse no
// snapshot holds any more is collected, and its key removed.
var parses = struct {
	mu sync.Mutex
	m  map[parseKey]weak.Pointer[parsed]
}{m: map[parseKey]weak.Pointer[parsed]{}}

// parseShared returns the parse of data, read from path with the given hash:
// one already held by another Backend, or a new one.
func parseShared(path string, hash [32]byte, data []byte) *parsed {
	k := parseKey{path, hash}
	parses.mu.Lock()
	defer parses.mu.Unlock()
	if p := parses.m[k].Value(); p != nil {
		return p
	}
	p := &parsed{}
	p.entries, p.err = parse(path, data)
	parses.m[k] = weak.Make(p)
	runtime.AddCleanup(p, forgetParse, k)
	return p
}

// forgetParse removes k's entry once its parse has been collected (unless a
// new parse took its place).
func forgetParse(k parseKey) {
	parses.mu.Lock()
	defer parses.mu.Unlock()
	if parses.m[k].Value() == nil {
		delete(parses.m, k)
	}
}

// parse splits the file into its credentials. A whole-file error never quotes content.
func parse(path string, data []byte) (map[string]entry, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		var syn *jsonnode.SyntaxError // where the policy's and hooks.json's errors are: at the offending byte
		if _, perr := jsonnode.Parse(data, jsonnode.Options{}); errors.As(perr, &syn) {
			return nil, fmt.Errorf("credentials file %s: not valid JSON (syntax error at line %d, column %d)", path, syn.Line, syn.Column)
		}
		return nil, fmt.Errorf("credentials file %s: not a JSON object of credential ID -> secret", path)
	}
	if top == nil { // the file says null
		return nil, fmt.Errorf("credentials file %s: not a JSON object of credential ID -> secret", path)
	}
	entries := make(map[string]entry, len(top))
	for id, raw := range top {
		entries[id] = parseEntry(id, raw)
	}
	return entries, nil
}

// versionKey keys the version fingerprints. A plain hash of a secret in the logs would
// let anyone who reads them confirm guesses of a weak one (a Basic password) offline;
// keyed with a random per-process key it cannot, and it is still stable for as long as
// the Store needs it (the process's life).
var versionKey = func() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic("credential/file: no randomness for the version key: " + err.Error())
	}
	return k
}()

// parseEntry turns one secret into what it sets and a version: an HMAC-SHA256 of its canonical
// JSON (encoding/json sorts map keys) under versionKey. A secret that is not an object
// reaches Parse as nil.
func parseEntry(id string, raw json.RawMessage) entry {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		v = nil // cannot happen: the whole file decoded
	}
	m, _ := v.(map[string]any)
	secret, err := credential.Parse(id, m)
	if err != nil {
		return entry{err: err}
	}
	canon, err := json.Marshal(m)
	if err != nil {
		return entry{err: fmt.Errorf("credential %s: %w", id, credential.ErrInvalid)}
	}
	mac := hmac.New(sha256.New, versionKey)
	mac.Write(canon)
	return entry{secret: secret, version: "hmac:" + hex.EncodeToString(mac.Sum(nil))[:versionLen]}
}
