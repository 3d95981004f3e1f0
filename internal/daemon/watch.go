package daemon

import (
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/egressd/egressd/internal/config"
)

// The watcher reloads egressd, as SIGHUP does, when the config file, the policy file
// it names (policy.file) or hooks.file changes.
//
// It polls rather than using inotify: polling sees a Kubernetes ConfigMap update (the
// kubelet swaps a ..data symlink, so the file a path leads to changes while the
// directory entry the path names does not), works on any filesystem, and needs nothing
// beyond stat and read. Every watchInterval each file is stat'ed, following symlinks,
// and compared with what the last reload read: size, mtime, and identity (inode and
// device, through os.SameFile). Its content is hashed (SHA-256) when the stat differs,
// when its mtime is within racyWindow (a rewrite can hide inside one timestamp tick on
// coarse filesystems), and on every hashEvery-th poll (a rewrite that keeps size, mtime
// and inode, as cp -p does). Only a different content is a change: a touch is not.
//
// A change is debounced: the files must then keep the same content for settleTime,
// checked every settlePoll, before the reload starts, so the several writes of an
// editor or a deployment tool make one reload of the finished file. settleTime is
// longer than the 200 ms that would do for that so that an operator's usual "edit, then
// kill -HUP" makes one reload, not two: the SIGHUP reload reads the change first and
// the watcher, finding nothing new, does nothing. Files still changing after maxSettle
// are reloaded as they are; validation rejects a half-written file, and the next write
// is a change again.
//
// Whatever triggers a reload (SIGHUP, POST /v1/reload, the watcher), what it read
// becomes the baseline, even when the reload is rejected: a change is reloaded once,
// and a rejected file is not retried until it changes again. The watched files are
// those of the config in force, plus the files a rejected reload's problems name (a
// broken policy file that only the rejected config names), so fixing one is seen too.
// A change made between egressd's start-up load and the watcher's first look is not
// seen; SIGHUP or POST /v1/reload picks it up.
//
// The credentials file is not watched here: the file backend (internal/credential/file)
// polls it itself and refreshes the credential store, which needs no reload.
const (
	// watchInterval is how often the watched files are stat'ed.
	watchInterval = time.Second
	// settleTime is how long a changed file must keep its content before the reload.
	settleTime = 500 * time.Millisecond
	// settlePoll is how often a changed file is looked at while it settles.
	settlePoll = 100 * time.Millisecond
	// maxSettle bounds the wait for a file that keeps changing.
	maxSettle = 10 * time.Second
	// racyWindow: a file modified this recently is hashed on every poll.
	racyWindow = 2 * time.Second
	// hashEvery: every this many polls every file is hashed, whatever its stat says.
	hashEvery = 10
	// maxWatchBytes bounds how much of a file is hashed; the loaders refuse larger files.
	maxWatchBytes = 64 << 20
)

// fileState is one look at a watched file.
type fileState struct {
	fi   fs.FileInfo       // nil when the file could not be opened or stat'ed
	sum  [sha256.Size]byte // the content's hash, when read
	read bool
}

// observe stats and hashes the file at path, following symlinks. The stat is taken on
// the open file, so it describes the content hashed even while the path is swapped.
func observe(path string) fileState {
	f, err := os.Open(path)
	if err != nil {
		fi, _ := os.Stat(path)
		return fileState{fi: fi}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileState{}
	}
	st := fileState{fi: fi}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxWatchBytes)); err == nil {
		h.Sum(st.sum[:0])
		st.read = true
	}
	return st
}

// sameContent reports whether a and b saw the same content (or both none).
func sameContent(a, b fileState) bool { return a.read == b.read && a.sum == b.sum }

// sameStat reports whether a and b describe the same, unmodified file.
func sameStat(a, b fs.FileInfo) bool {
	return a != nil && b != nil && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime()) && os.SameFile(a, b)
}

// watcher holds the watched files and what the last reload read of each.
type watcher struct {
	mu    sync.Mutex
	base  map[string]fileState // by path
	polls int
}

// newWatcher watches the files of l, the config egressd started with.
func newWatcher(cfgPath string, l *Loaded) *watcher {
	w := &watcher{}
	w.reset(cfgPath, l, nil)
	return w
}

// watchedFiles are the files config l is made of: the config file (none for the
// quick-start defaults), the policy file and hooks.file.
func watchedFiles(cfgPath string, l *Loaded) []string {
	var paths []string
	for _, p := range []string{cfgPath, l.Cfg.Policy.File, l.Cfg.Hooks.File} {
		if p != "" && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	return paths
}

// run polls until ctx ends and calls reload once a change has settled.
func (w *watcher) run(ctx context.Context, reload func()) {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.changed() != "" && w.settle(ctx) {
			reload()
		}
	}
}

// changed returns a watched file whose content differs from what the last reload
// read, or "". Unchanged content under a new stat (a touch) becomes the baseline.
func (w *watcher) changed() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polls++
	for p, b := range w.base {
		fi, err := os.Stat(p)
		if err == nil && sameStat(fi, b.fi) && time.Since(fi.ModTime()) > racyWindow && w.polls%hashEvery != 0 {
			continue
		}
		cur := fileState{}
		if err == nil {
			cur = observe(p)
		}
		if !sameContent(cur, b) {
			return p
		}
		w.base[p] = cur
	}
	return ""
}

// settle waits until the watched files have kept their content for settleTime, or
// maxSettle has passed; it returns false if ctx ends first.
func (w *watcher) settle(ctx context.Context) bool {
	prev := w.observeAll()
	stable := time.Now()
	deadline := stable.Add(maxSettle)
	t := time.NewTicker(settlePoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		now, cur := time.Now(), w.observeAll()
		if !sameAll(prev, cur) {
			prev, stable = cur, now
		}
		if now.Sub(stable) >= settleTime || now.After(deadline) {
			return true
		}
	}
}

func sameAll(a, b map[string]fileState) bool {
	if len(a) != len(b) {
		return false
	}
	for p, s := range a {
		if t, ok := b[p]; !ok || !sameContent(s, t) {
			return false
		}
	}
	return true
}

// observeAll looks at every watched file. A reload calls it before it loads anything.
func (w *watcher) observeAll() map[string]fileState {
	w.mu.Lock()
	paths := make([]string, 0, len(w.base))
	for p := range w.base {
		paths = append(paths, p)
	}
	w.mu.Unlock()
	out := make(map[string]fileState, len(paths))
	for _, p := range paths {
		out[p] = observe(p)
	}
	return out
}

// reset watches the files of l, the config now in force, with what the reload read
// (observeAll before it Loaded) as their baseline; a file the old config did not name
// is looked at now.
func (w *watcher) reset(cfgPath string, l *Loaded, read map[string]fileState) {
	base := make(map[string]fileState)
	for _, p := range watchedFiles(cfgPath, l) {
		st, ok := read[p]
		if !ok {
			st = observe(p)
		}
		base[p] = st
	}
	w.mu.Lock()
	w.base = base
	w.mu.Unlock()
}

// rejected records what a rejected reload read as the baseline, and adds the files its
// problems name to the watched set, until the next reload that succeeds.
func (w *watcher) rejected(read map[string]fileState, verr *config.ValidationError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, st := range read {
		if _, ok := w.base[p]; ok {
			w.base[p] = st
		}
	}
	for _, pr := range verr.Problems {
		if _, ok := w.base[pr.File]; pr.File != "" && !ok {
			w.base[pr.File] = observe(pr.File)
		}
	}
}
