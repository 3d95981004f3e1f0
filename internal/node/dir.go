package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// specExts are the file names of specs in node.sandboxes_dir: <id>.json, <id>.yaml
// or <id>.yml.
var specExts = []string{".json", ".yaml", ".yml"}

// DirPoll is how often the sandboxes directory is read: a changed spec is in force
// within a second or two of its write, well inside the five the contract allows.
const DirPoll = time.Second

// dirRetry is how long a spec that could not be served (its network namespace not
// there yet, a port in use) waits before it is tried again, unchanged.
var dirRetry = 5 * time.Second

// DirWatch is the state of one watched directory: the hash of each spec file last
// applied (or refused), by sandbox ID, and when a spec that failed is tried again.
type DirWatch struct {
	r     *Registry
	dir   string
	seen  map[string][sha256.Size]byte
	retry map[string]time.Time
}

// ScanDir applies the specs in dir (a refused one logged at WARN with its
// problems, and changing nothing) and returns the watch that applies what changes
// there from now on (Watch).
func (r *Registry) ScanDir(dir string) *DirWatch {
	w := &DirWatch{r: r, dir: dir, seen: map[string][sha256.Size]byte{}, retry: map[string]time.Time{}}
	w.scan()
	return w
}

// Watch reads the directory again every DirPoll until ctx ends: a new or changed
// file is applied, a removed one removes its sandbox.
func (w *DirWatch) Watch(ctx context.Context) { every(ctx, DirPoll, w.scan) }

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// scan applies what changed in the directory since the last scan.
func (w *DirWatch) scan() {
	files, err := specFiles(w.dir)
	if err != nil {
		w.r.log.Warn().Err(err).Str("dir", w.dir).Msg("cannot read the sandboxes directory; the sandboxes stay as they are")
		return
	}
	for id, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			w.r.log.Warn().Err(err).Str("sandbox", id).Msg("cannot read the sandbox spec")
			continue
		}
		sum := sha256.Sum256(data)
		if prev, ok := w.seen[id]; ok && prev == sum && (w.retry[id].IsZero() || time.Now().Before(w.retry[id])) {
			continue
		}
		w.seen[id] = sum
		if w.r.isBuried(id, hex.EncodeToString(sum[:])) {
			continue // the API removed what this very file put in force
		}
		res, problems := w.r.Apply(id, data, w.dir, SourceDir)
		w.r.logApply(id, file, res, problems)
		delete(w.retry, id)
		if res == Failed {
			w.retry[id] = time.Now().Add(dirRetry)
		}
	}
	for id := range w.seen {
		if _, ok := files[id]; !ok {
			delete(w.seen, id)
			delete(w.retry, id)
			w.r.unbury(id)
			if w.r.Remove(id, SourceDir) {
				w.r.log.Info().Str("sandbox", id).Msg("sandbox removed: its spec file is gone")
			}
		}
	}
}

// specFiles maps each sandbox ID to its spec file in dir; of two files naming one
// ID, the first in specExts' order.
func specFiles(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		id := strings.TrimSuffix(e.Name(), ext)
		if !e.Type().IsRegular() || !slices.Contains(specExts, ext) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if prev, dup := files[id]; dup && slices.Index(specExts, filepath.Ext(prev)) < slices.Index(specExts, ext) {
			continue
		}
		files[id] = filepath.Join(dir, e.Name())
	}
	return files, nil
}
