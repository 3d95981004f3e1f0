package soak_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"time"

	"github.com/egressd/egressd/internal/atomicfile"
)

// The operator's side of the soak.
const (
	reloadEvery = 30 * time.Second
	// rotateEvery and rotateOffset: rotations at 45 s, 1m45s, ...: between two
	// reloads, so the effect of each is seen on its own.
	rotateEvery  = time.Minute
	rotateOffset = 45 * time.Second
	// rotationGrace: after it, the upstream must see only the new token. The file
	// backend polls the file every second (internal/credential/file).
	rotationGrace = 3 * time.Second
	// reloadTimeout bounds the wait for one reload's effect.
	reloadTimeout = 15 * time.Second
	// opsTail: no operation starts later than this before the load's end, so each is
	// followed by load that shows its effect.
	opsTail = 5 * time.Second
)

// operator performs the reloads and rotations.
type operator struct {
	e           *egressd
	f           *files
	tally       *tally
	creds       *credTracker
	adminReload bool // POST /v1/reload is served
	broken      []brokenPolicy
}

// event is one scheduled operation.
type event struct {
	at  time.Duration
	run func()
}

// schedule lists the operations of a load of duration d, in time order.
func (o *operator) schedule(d time.Duration) []event {
	var evs []event
	n := 0
	for at := reloadEvery; at <= d-opsTail; at += reloadEvery {
		i := n
		evs = append(evs, event{at, func() { o.reload(i) }})
		n++
	}
	for at := rotateOffset; at+rotationGrace+opsTail <= d; at += rotateEvery {
		evs = append(evs, event{at, o.rotate})
	}
	// Sort by time (two short lists).
	for i := 1; i < len(evs); i++ {
		for j := i; j > 0 && evs[j].at < evs[j-1].at; j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
	return evs
}

// run performs the operations at their times after start, until stop is closed.
func (o *operator) run(start time.Time, evs []event, stop <-chan struct{}) {
	for _, ev := range evs {
		select {
		case <-stop:
			return
		case <-time.After(time.Until(start.Add(ev.at))):
		}
		ev.run()
	}
}

// reload performs the n-th reload (from 0). Even ones write a valid policy change (a
// spare entry, a new order: no decision the load checks changes), odd ones a broken
// policy file, which must be rejected with nothing changed. The trigger alternates
// in pairs, SIGHUP, POST /v1/reload (when served), POST, SIGHUP, ..., so each kind
// meets each trigger, and the first three reloads (a 2-minute run) are a valid
// change by SIGHUP, a broken file by POST and a valid change by POST.
func (o *operator) reload(n int) {
	valid, trigger := reloadPlan(n, o.adminReload)
	what, data := "valid policy change", o.f.validPolicy(n/2+1)
	if !valid {
		b := o.broken[(n/2)%len(o.broken)]
		what, data = "broken policy ("+b.name+")", b.data
	}
	label := fmt.Sprintf("reload %d, %s by %s", n+1, what, trigger)
	fail := func(format string, args ...any) {
		o.tally.violation("reload", "%s: %s", label, fmt.Sprintf(format, args...))
	}
	before, err := o.e.Metrics()
	if err != nil {
		fail("metrics before: %v", err)
		return
	}
	hashBefore, err := o.e.configHash()
	if err != nil {
		fail("%v", err)
		return
	}
	if err := atomicfile.Write(o.f.policy, data, 0o600); err != nil {
		fail("writing the policy: %v", err)
		return
	}
	var adminCode int
	var adminBody []byte
	switch trigger {
	case "sighup":
		err = o.e.signal(syscall.SIGHUP)
	case "admin":
		adminCode, adminBody, err = o.e.adminReload()
	}
	if err != nil {
		fail("%v", err)
		return
	}
	after, err := o.waitReload(before)
	if err != nil {
		fail("%v", err)
		return
	}
	hashAfter, err := o.e.configHash()
	if err != nil {
		fail("%v", err)
		return
	}
	okDelta := after[seriesReloadOK] - before[seriesReloadOK]
	errDelta := after[seriesReloadErr] - before[seriesReloadErr]
	var resp struct {
		Result     string            `json:"result"`
		ConfigHash string            `json:"config_hash"`
		Problems   []json.RawMessage `json:"problems"`
	}
	if trigger == "admin" {
		if err := json.Unmarshal(adminBody, &resp); err != nil {
			fail("POST /v1/reload: %d, body not JSON: %s", adminCode, snippet(adminBody, 300))
			return
		}
	}
	switch {
	case valid && (okDelta < 1 || errDelta != 0 || hashAfter == hashBefore):
		fail("reloads ok +%v, error +%v, config_hash %s -> %s; want ok +1 and a new hash", okDelta, errDelta, hashBefore, hashAfter)
	case !valid && (errDelta < 1 || okDelta != 0 || hashAfter != hashBefore):
		fail("reloads ok +%v, error +%v, config_hash %s -> %s; want rejected, nothing changed (FAILED OPEN if ok)", okDelta, errDelta, hashBefore, hashAfter)
	case trigger == "admin" && valid && (adminCode != http.StatusOK || resp.Result != "ok" || resp.ConfigHash != hashAfter):
		fail("POST /v1/reload: %d %s, want 200 result ok with config_hash %s", adminCode, snippet(adminBody, 300), hashAfter)
	case trigger == "admin" && !valid && (adminCode != http.StatusUnprocessableEntity || resp.Result != "error" || len(resp.Problems) == 0):
		fail("POST /v1/reload: %d %s, want 422 result error with problems", adminCode, snippet(adminBody, 300))
	default:
		o.tally.mu.Lock()
		if valid {
			o.tally.reloadOK[trigger]++
		} else {
			o.tally.reloadRejected[trigger]++
		}
		o.tally.mu.Unlock()
		if okDelta+errDelta > 1 {
			// egressd's file watcher reloads a changed policy file by itself once it has
			// kept its content for 0.5 s; when the trigger reaches egressd later than that
			// (a busy machine), it reloads again, as it must. The log's sources tell.
			o.tally.note(fmt.Sprintf("%s was counted as %v reloads (see the reloads by source in the log summary)", label, okDelta+errDelta))
		}
	}
}

// reloadPlan says what the n-th reload is (see reload): a valid change or a broken
// file, and its trigger, "sighup" or "admin" (POST /v1/reload, when served).
func reloadPlan(n int, adminReload bool) (valid bool, trigger string) {
	trigger = "sighup"
	if adminReload && (n%4 == 1 || n%4 == 2) {
		trigger = "admin"
	}
	return n%2 == 0, trigger
}

// waitReload waits until egressd has counted a reload after before, and returns
// the metrics then.
func (o *operator) waitReload(before map[string]float64) (map[string]float64, error) {
	deadline := time.Now().Add(reloadTimeout)
	for {
		m, err := o.e.Metrics()
		if err == nil && m[seriesReloadOK]+m[seriesReloadErr] > before[seriesReloadOK]+before[seriesReloadErr] {
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no reload counted within %v (last error: %v)", reloadTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rotate writes a new token into the credentials file. The tracker learns it
// first, so the upstream accepts it as soon as egressd sends it, and rejects the
// old one once the grace is over.
func (o *operator) rotate() {
	o.creds.rotate()
	if err := atomicfile.Write(o.f.creds, o.creds.file(), 0o600); err != nil {
		o.tally.violation("rotation", "writing the credentials file: %v", err)
		return
	}
	o.tally.mu.Lock()
	o.tally.rotations++
	o.tally.mu.Unlock()
}
