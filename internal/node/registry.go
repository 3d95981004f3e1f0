// Package node is node mode's registry: the sandboxes one egressd serves, each
// registered at runtime from a spec (a file in node.sandboxes_dir, or a PUT on the
// node API's Unix socket), validated, served, changed and removed without touching
// any other. What serving a sandbox means (its listeners, Snapshot and credential
// store) is the Host's business; the registry keeps which spec each sandbox serves
// and the problems of the last one refused.
package node

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/config"
)

// Host validates and serves sandbox specs (internal/daemon).
type Host interface {
	// Load validates spec data of sandbox id, relative paths against baseDir. It
	// returns every problem, and the validated spec when none is an error.
	Load(id string, data []byte, baseDir string) (Spec, []config.Problem)
	// Serve puts spec in force for its sandbox: prev (nil for a new sandbox) is
	// changed in place or replaced. On an error prev is left as it was, or, when it
	// could not be, closed and nil returned with the error.
	Serve(spec Spec, prev Sandbox) (Sandbox, error)
}

// Spec is a validated sandbox spec.
type Spec interface {
	ID() string
	Hash() string // the spec's bytes' SHA-256: an unchanged spec changes nothing
}

// Sandbox is a sandbox being served.
type Sandbox interface {
	// Close stops its listeners and closes every connection it holds.
	Close()
	// Status is what GET /v1/sandboxes/{id} shows of it beside the registry's own.
	Status() Status
}

// Status is a sandbox's live figures: never a secret, only names and counts.
type Status struct {
	Requests    map[string]int64  `json:"requests"` // records by decision: allow, deny, error
	Open        int               `json:"open_connections"`
	Credentials any               `json:"credentials"` // each credential ID's state
	Listeners   map[string]string `json:"listeners"`   // name -> bound address
	Netns       string            `json:"netns,omitempty"`
	// Env is what the sandbox's environment gets for its environment_variable
	// credentials: NAME -> placeholder (derived per sandbox; never the secret).
	Env map[string]string `json:"env"`
	// Memory is what the sandbox holds of its share of the node's memory budget.
	Memory any `json:"memory,omitempty"`
}

// Where a spec came from: a spec file and the API may name the same sandbox, and a
// file's removal removes only what the file put in force.
const (
	SourceDir = "dir"
	SourceAPI = "api"
)

// entry is one registered sandbox.
type entry struct {
	spec     Spec
	hash     string
	source   string
	sb       Sandbox
	problems []config.Problem // of the spec in force (warnings), or of the last one refused
}

// Keeper keeps the specs in force beyond this process: with the supervising
// parent, which hands them to the next worker (internal/keep). The API's, which
// nothing else holds; a file's too, since the file may hold a spec refused since
// (the sandbox goes on with the last good one, and so must the next worker).
type Keeper interface {
	KeepSpec(id string, k Kept)
	ForgetSpec(id string)
	KeptSpecs() map[string]Kept // by sandbox ID: what a previous process kept
}

// Kept is a spec in force, as kept.
type Kept struct {
	Source  string `json:"source"`
	BaseDir string `json:"base_dir"`
	Data    []byte `json:"data"`
}

// Registry holds the sandboxes a node serves. Changes are serialised: one at a
// time, so each is decided on what the others left.
type Registry struct {
	host Host
	max  int
	log  zerolog.Logger
	keep Keeper // nil: nothing kept

	// buried holds, by ID, the spec hash of each sandbox a spec file put in force
	// that the API removed: its file, unchanged, does not bring it back, in this
	// process or the next (the Keeper keeps the record).
	buried map[string]string

	mu      sync.Mutex
	entries map[string]*entry
}

// New returns an empty Registry serving at most max sandboxes through host.
func New(host Host, max int, log zerolog.Logger) *Registry {
	return &Registry{host: host, max: max, log: log, entries: map[string]*entry{}}
}

// Result says what Apply did.
type Result int

const (
	Refused   Result = iota // a problem is an error: nothing changed
	Failed                  // the spec is valid but could not be served (its netns, a port in use)
	Created                 // a new sandbox serves
	Changed                 // the sandbox serves the new spec
	Unchanged               // the same spec was in force already
)

// Apply validates spec data of sandbox id from source and, when it has no error,
// puts it in force. A refused spec changes nothing the sandbox already has; its
// problems are kept for Get.
func (r *Registry) Apply(id string, data []byte, baseDir, source string) (Result, []config.Problem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.entries[id]
	spec, problems := r.host.Load(id, data, baseDir)
	if spec == nil {
		r.refused(prev, problems)
		return Refused, problems
	}
	if prev != nil && prev.hash == spec.Hash() {
		r.kept(id, Kept{source, baseDir, data}, prev)
		prev.source, prev.problems = source, problems
		return Unchanged, problems
	}
	if prev == nil && len(r.entries) >= r.max {
		problems = append(problems, config.Problem{Path: "id", Msg: fmt.Sprintf("the node serves node.max_sandboxes (%d) sandboxes already", r.max)})
		return Refused, problems
	}
	var prevSB Sandbox
	if prev != nil {
		prevSB = prev.sb
	}
	sb, err := r.host.Serve(spec, prevSB)
	if err != nil {
		problems = append(problems, config.Problem{Msg: err.Error()})
		if sb == nil && prev != nil {
			delete(r.entries, id) // Serve closed it
			r.kept(id, Kept{}, prev)
		}
		r.refused(r.entries[id], problems)
		return Failed, problems
	}
	r.entries[id] = &entry{spec: spec, hash: spec.Hash(), source: source, sb: sb, problems: problems}
	delete(r.buried, id)
	r.kept(id, Kept{source, baseDir, data}, prev)
	if prev == nil {
		return Created, problems
	}
	return Changed, problems
}

// refused keeps the problems of a refused spec on the sandbox it was for, if any.
func (r *Registry) refused(e *entry, problems []config.Problem) {
	if e != nil {
		e.problems = slices.Clone(problems)
	}
}

// Remove stops sandbox id and closes its connections; false when there is none.
// With a source, only a sandbox that source put in force is removed.
func (r *Registry) Remove(id, source string) bool {
	r.mu.Lock()
	defer r.mu.Unlock() // held while it closes: a new spec for id then binds its addresses
	e := r.entries[id]
	if e == nil || source != "" && e.source != source {
		return false
	}
	delete(r.entries, id)
	r.kept(id, Kept{}, e)
	if source == "" && e.source == SourceDir {
		r.bury(id, e.hash)
	}
	e.sb.Close()
	return true
}

// sourceBuried marks a kept record that is no spec: the hash of a spec file
// whose sandbox the API removed.
const sourceBuried = "buried"

// bury remembers that the API removed the sandbox spec file hash put in force.
func (r *Registry) bury(id, hash string) {
	if r.buried == nil {
		r.buried = map[string]string{}
	}
	r.buried[id] = hash
	if r.keep != nil {
		r.keep.KeepSpec(id, Kept{Source: sourceBuried, Data: []byte(hash)})
	}
}

// isBuried reports whether a spec file for id with this hash stays unapplied:
// the API removed the sandbox it put in force, and the file has not changed.
func (r *Registry) isBuried(id, hash string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.buried[id]
	return ok && h == hash
}

// unbury forgets id's record: its file is gone.
func (r *Registry) unbury(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.buried[id]; ok {
		delete(r.buried, id)
		if r.keep != nil {
			r.keep.ForgetSpec(id)
		}
	}
}

// KeepSpecs makes k keep every spec put in force, from now on, and takes back
// the records of spec files whose sandboxes the API removed. Call it before the
// directory's first scan.
func (r *Registry) KeepSpecs(k Keeper) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keep = k
	for id, kept := range k.KeptSpecs() {
		if kept.Source == sourceBuried {
			if r.buried == nil {
				r.buried = map[string]string{}
			}
			r.buried[id] = string(kept.Data)
		}
	}
}

// Restore puts in force again the specs the Keeper kept, after the directory's
// first scan: an API spec always; a file's only when its file is still there but
// served nothing (it was refused since: the sandbox goes on with its last good
// spec). One that no longer validates or serves (its namespace is gone, the
// node's config changed) is let go, with the WARN line that says why: the node
// agent registers it again.
func (r *Registry) Restore() {
	restored := 0
	for id, k := range r.keep.KeptSpecs() {
		if k.Source == sourceBuried || k.Source == SourceDir && !r.lastGood(id, k.BaseDir) {
			continue
		}
		res, problems := r.Apply(id, k.Data, k.BaseDir, k.Source)
		r.logApply(id, "", res, problems)
		if res == Refused || res == Failed {
			r.keep.ForgetSpec(id)
			continue
		}
		restored++
	}
	if restored > 0 {
		r.log.Info().Int("sandboxes", restored).Msg("sandboxes served before this worker started: registered again")
	}
}

// lastGood reports whether a kept spec file's spec is needed: its file is still
// in dir and nothing serves id (the file's spec was refused). A file that is gone
// took its sandbox with it.
func (r *Registry) lastGood(id, dir string) bool {
	r.mu.Lock()
	_, served := r.entries[id]
	r.mu.Unlock()
	files, err := specFiles(dir)
	if _, there := files[id]; err == nil && !there {
		r.keep.ForgetSpec(id)
	}
	return !served && err == nil && files[id] != ""
}

// kept tells the Keeper that sandbox id serves k now (a zero k: it is gone),
// where it served prev's before (nil when new).
func (r *Registry) kept(id string, k Kept, prev *entry) {
	switch {
	case r.keep == nil:
	case k.Source == "":
		r.keep.ForgetSpec(id)
	case prev == nil || prev.source != k.Source || prev.hash != r.entries[id].hash:
		r.keep.KeepSpec(id, k)
	}
}

// RenewEvery calls Renew every DirPoll until ctx ends.
func (r *Registry) RenewEvery(ctx context.Context, stale func(Sandbox) bool) {
	every(ctx, DirPoll, func() { r.Renew(stale) })
}

// Renew serves anew, with the spec it has, every sandbox stale reports (its
// network namespace was made anew at the same path: its sockets are in the old
// one). One that cannot be served anew goes on as it was, with a WARN line.
func (r *Registry) Renew(stale func(Sandbox) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.entries {
		if !stale(e.sb) {
			continue
		}
		sb, err := r.host.Serve(e.spec, e.sb)
		if err != nil {
			r.log.Warn().Err(err).Str("sandbox", id).Msg("cannot serve the sandbox in its new network namespace; it keeps its sockets in the old one")
			continue
		}
		e.sb = sb
		r.log.Info().Str("sandbox", id).Msg("the sandbox's network namespace was made anew: it is served in the new one")
	}
}

// Info is GET /v1/sandboxes/{id}: the registry's view of a sandbox and its Status.
type Info struct {
	ID       string           `json:"id"`
	Source   string           `json:"source"`
	SpecHash string           `json:"spec_hash"`
	Problems []config.Problem `json:"problems"`
	Status
}

// Get returns sandbox id's Info; false when there is none.
func (r *Registry) Get(id string) (Info, bool) {
	r.mu.Lock()
	e := r.entries[id]
	r.mu.Unlock()
	if e == nil {
		return Info{}, false
	}
	problems := e.problems
	if problems == nil {
		problems = []config.Problem{}
	}
	return Info{ID: id, Source: e.source, SpecHash: e.hash, Problems: problems, Status: e.sb.Status()}, true
}

// IDs lists the registered sandboxes, sorted.
func (r *Registry) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.entries))
	for id := range r.entries {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Drainer is a Sandbox that can let its requests in flight finish before it closes.
type Drainer interface {
	Drain(ctx context.Context)
}

// Drain removes every sandbox, all at once: each drains until ctx ends (a Drainer)
// or closes.
func (r *Registry) Drain(ctx context.Context) {
	r.mu.Lock()
	entries := r.entries
	r.entries = map[string]*entry{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range entries {
		wg.Go(func() {
			if d, ok := e.sb.(Drainer); ok {
				d.Drain(ctx)
				return
			}
			e.sb.Close()
		})
	}
	wg.Wait()
}
