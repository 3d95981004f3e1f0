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
	hash     string
	source   string
	sb       Sandbox
	problems []config.Problem // of the spec in force (warnings), or of the last one refused
}

// Keeper keeps the specs registered through the API beyond this process: with
// the supervising parent, which hands them to the next worker (internal/keep).
// A spec file needs no keeping: the next worker reads the directory.
type Keeper interface {
	KeepSpec(id string, data []byte)
	ForgetSpec(id string)
	KeptSpecs() map[string][]byte // by sandbox ID: what a previous process kept
}

// Registry holds the sandboxes a node serves. Changes are serialised: one at a
// time, so each is decided on what the others left.
type Registry struct {
	host Host
	max  int
	log  zerolog.Logger
	keep Keeper // nil: nothing kept

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
		r.kept(id, data, source, prev)
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
			r.kept(id, nil, "", prev)
		}
		r.refused(r.entries[id], problems)
		return Failed, problems
	}
	r.entries[id] = &entry{hash: spec.Hash(), source: source, sb: sb, problems: problems}
	r.kept(id, data, source, prev)
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
	r.kept(id, nil, "", e)
	e.sb.Close()
	return true
}

// KeepSpecs makes k keep every spec put in force through the API, from now on.
func (r *Registry) KeepSpecs(k Keeper) { r.keep = k }

// Restore puts in force again the API specs the Keeper kept. One that no longer
// validates or serves (its namespace is gone, the node's config changed) is let
// go, with the WARN line that says why: the node agent registers it again.
func (r *Registry) Restore() {
	specs := r.keep.KeptSpecs()
	for id, data := range specs {
		res, problems := r.Apply(id, data, "", SourceAPI)
		r.logApply(id, "", res, problems)
		if res == Refused || res == Failed {
			r.keep.ForgetSpec(id)
		}
	}
	if len(specs) > 0 {
		r.log.Info().Int("sandboxes", len(specs)).Msg("sandboxes registered through the API before this worker started: registered again")
	}
}

// kept tells the Keeper that sandbox id serves data from source now ("" when it
// is gone), where it served prev's before (nil when new): an API spec is kept, one
// that a file or a removal replaced is let go.
func (r *Registry) kept(id string, data []byte, source string, prev *entry) {
	switch {
	case r.keep == nil:
	case source == SourceAPI && (prev == nil || prev.source != SourceAPI || prev.hash != r.entries[id].hash):
		r.keep.KeepSpec(id, data)
	case source != SourceAPI && prev != nil && prev.source == SourceAPI:
		r.keep.ForgetSpec(id)
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
