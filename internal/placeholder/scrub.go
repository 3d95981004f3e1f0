package placeholder

import (
	"slices"
	"time"

	"github.com/egressd/egressd/internal/scrub"
)

// What a response must never show is every value egressd may have placed, not
// just the ones the request it answers carried: an upstream can store a value
// one request sent (a POSTed placeholder, replaced) and serve it to another (a
// later plain GET). So the Replacer keeps one scrub.Set of the values of all its
// credentials, compiled when a value changes, never per request.

// sweepEvery is how often Scrub re-reads every credential for a value it has
// not seen. A value Apply places is added at once, before its request is
// forwarded; the sweep is for values this process has not placed yet (another
// replica may have, behind the same upstream), and it bounds how stale the Set
// can be against the credential store.
const sweepEvery = time.Second

// keepValues is how many values of one credential stay scrubbed: the current
// one and the ones before it, which an upstream may still hold after a
// rotation. It bounds the Set when a credential rotates often.
const keepValues = 4

// valueSet is one snapshot of the values to scrub and their Set. It is
// immutable once stored.
type valueSet struct {
	byID  map[string][]string // credential ID -> its values, the newest first
	set   *scrub.Set
	swept time.Time // when every credential was last read; zero: never
}

// Scrub returns the Set that masks every value of the Replacer's
// environment_variable credentials: the current value of each (read from the
// credentials at most sweepEvery ago) and up to keepValues-1 earlier ones,
// whether or not a request carried its placeholder. Nil when the Replacer has
// no credentials. Safe for concurrent use; it compiles only when a value is new.
func (r *Replacer) Scrub() *scrub.Set {
	if r == nil || len(r.ids) == 0 {
		return nil
	}
	p := r.values.Load()
	if p == nil || time.Since(p.swept) >= sweepEvery {
		p = r.sweep()
	}
	return p.set
}

// sweep reads every credential and stores the snapshot with the values it
// did not hold yet. One request sweeps at a time; the others go on with the
// last snapshot rather than wait, unless there is none.
func (r *Replacer) sweep() *valueSet {
	if !r.mu.TryLock() {
		if p := r.values.Load(); p != nil {
			return p
		}
		r.mu.Lock()
	}
	defer r.mu.Unlock()
	p := r.values.Load()
	if p != nil && time.Since(p.swept) < sweepEvery {
		return p // swept while this one waited
	}
	vals := map[string]string{}
	for _, id := range r.ids {
		if v, err := r.creds.Get(id); err == nil && v.Env != nil {
			vals[id] = v.Env.Value
		}
	}
	p = p.with(vals)
	p.swept = time.Now()
	r.values.Store(p)
	return p
}

// note makes sure value, which Apply is about to place for id, is in the Set
// before the request goes out.
func (r *Replacer) note(id, value string) {
	if p := r.values.Load(); p.has(id, value) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.values.Load()
	if !p.has(id, value) {
		r.values.Store(p.with(map[string]string{id: value}))
	}
}

// has reports whether p scrubs value as a value of id.
func (p *valueSet) has(id, value string) bool {
	return p != nil && slices.Contains(p.byID[id], value)
}

// with returns p with vals (ID -> current value) added, compiled anew when one
// is new; p itself when none is. p may be nil.
func (p *valueSet) with(vals map[string]string) *valueSet {
	next := &valueSet{byID: map[string][]string{}}
	if p != nil {
		*next = *p
		next.byID = make(map[string][]string, len(p.byID))
		for id, vs := range p.byID {
			next.byID[id] = vs
		}
	}
	changed := p == nil
	for id, v := range vals {
		if !p.has(id, v) {
			next.byID[id] = append([]string{v}, next.byID[id][:min(len(next.byID[id]), keepValues-1)]...)
			changed = true
		}
	}
	if !changed {
		next.set = p.set
		return next
	}
	var all []string
	for _, vs := range next.byID {
		all = append(all, vs...)
	}
	next.set = scrub.Compile(all...)
	return next
}
