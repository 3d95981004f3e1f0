package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/scrub"
)

// Record is the canonical account of one request or tunnel: it becomes exactly one
// log line (message "egress") and one requests_total increment. Every field is
// written on every line, empty when it does not apply. Values are never secrets:
// header names and credential IDs only. It is written where the request is read,
// where the decision is made and where the response ends (docs/architecture.md);
// every refusal and failure through refused.
type Record struct {
	ReqID             string
	Listener          string
	Role              string
	Client            string
	Method            string
	Scheme            string
	Host              string
	Port              uint16
	Path              string // without the query
	Decision          string // allow | deny | error
	Reason            allowlist.Reason
	Detail            string
	Rule              string
	Intercepted       bool
	Injected          []string // header names
	Credential        string
	CredentialVersion string
	HookGroup         string
	HookEvent         string
	Status            int
	BytesIn           int64 // read from the sandbox
	BytesOut          int64 // written to the sandbox
	ResolvedIP        string
	Scrubbed          int    // injected values masked in the response
	Error             string // the cause of a failure, for operators; never sent to the client
	Start             time.Time
	Sandbox           string // the node-mode sandbox whose listener it arrived on; "" in a sidecar

	// mask is what the exchange's response is masked of: Error, which may quote
	// what the upstream sent or was sent (a malformed header line), is masked of it.
	mask  *scrub.Set
	tally *Tally
}

// Tally counts a Server's records by decision: a node-mode sandbox's own figures,
// which no metric label carries.
type Tally struct {
	Allow, Deny, Error atomic.Int64
}

func (t *Tally) add(decision string) {
	switch {
	case t == nil:
	case decision == metrics.DecisionAllow:
		t.Allow.Add(1)
	case decision == metrics.DecisionDeny:
		t.Deny.Add(1)
	default:
		t.Error.Add(1)
	}
}

// idPrefix makes request IDs unique across restarts; the counter makes them unique
// within a process without a random read per request.
var (
	idPrefix  = newIDPrefix()
	idCounter atomic.Uint64
)

func newIDPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newRequestID() string {
	return idPrefix + "-" + strconv.FormatUint(idCounter.Add(1), 36)
}

func newRecord(l *listener, client net.Addr) *Record {
	r := &Record{ReqID: newRequestID(), Listener: l.cfg.Name, Role: l.cfg.Role, Start: time.Now(),
		Sandbox: l.sandbox, tally: l.tally}
	if client != nil {
		r.Client = client.String()
	}
	return r
}

func (r *Record) setTarget(t allowlist.Target) {
	r.Host, r.Port = t.Host, t.Port
}

func (r *Record) setDecision(d allowlist.Decision) {
	r.Rule = d.RuleName()
	r.Intercepted = d.Intercept
	if !d.Allowed() {
		r.fail(d.Reason, d.Detail)
	}
}

// refused records err as classify reads it: the reason and detail of the first
// refusal or failure (fail), and its cause for operators (Error). It returns the
// refusal.
func (r *Record) refused(err error) *refusal {
	rf := classify(err)
	r.fail(rf.Reason, rf.Detail)
	if rf.Err != nil {
		r.Error = rf.Err.Error()
	}
	return rf
}

// fail records the first refusal or failure; later ones do not overwrite it.
func (r *Record) fail(reason allowlist.Reason, detail string) {
	if r.Reason != "" {
		return
	}
	r.Reason, r.Detail = reason, detail
}

func (r *Record) setResolved(a net.Addr) {
	if ta, ok := a.(*net.TCPAddr); ok {
		r.ResolvedIP = ta.IP.String()
	}
}

func (r *Record) decision() string {
	switch {
	case r.Reason == "":
		return metrics.DecisionAllow
	case r.Reason.IsDenial():
		return metrics.DecisionDeny
	default:
		return metrics.DecisionError
	}
}

// finish writes the log line and the metrics for the record.
func (r *Record) finish(log *zerolog.Logger, m *metrics.Metrics) {
	r.Decision = r.decision()
	r.tally.add(r.Decision)
	dur := time.Since(r.Start)
	m.Requests.WithLabelValues(r.Listener, r.Decision, string(r.Reason)).Inc()
	m.Duration.WithLabelValues(r.Listener).Observe(dur.Seconds())
	m.Bytes.WithLabelValues(metrics.DirectionIn).Add(float64(r.BytesIn))
	m.Bytes.WithLabelValues(metrics.DirectionOut).Add(float64(r.BytesOut))
	if r.Scrubbed > 0 {
		m.Scrubbed.WithLabelValues(r.Rule).Inc()
	}
	r.Error, _ = r.mask.String(r.Error)
	log.Info().
		Str("req_id", r.ReqID).Str("sandbox", r.Sandbox).Str("listener", r.Listener).Str("role", r.Role).
		Str("client", r.Client).Str("method", r.Method).Str("scheme", r.Scheme).
		Str("host", r.Host).Uint16("port", r.Port).Str("path", r.Path).
		Str("decision", r.Decision).Str("reason", string(r.Reason)).Str("detail", r.Detail).
		Str("rule", r.Rule).Bool("intercepted", r.Intercepted).Strs("injected", nonNil(r.Injected)).
		Str("credential", r.Credential).Str("credential_version", r.CredentialVersion).
		Str("hook_group", r.HookGroup).Str("hook_event", r.HookEvent).
		Int("status", r.Status).Int64("bytes_in", r.BytesIn).Int64("bytes_out", r.BytesOut).
		Str("resolved_ip", r.ResolvedIP).Int("scrubbed", r.Scrubbed).Str("error", r.Error).Int64("dur_ms", dur.Milliseconds()).
		Msg("egress")
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
