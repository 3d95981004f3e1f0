// Package metrics defines egressd's Prometheus series; every series is exported from the start.
package metrics

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/membudget"
)

// Decision label values of requests_total.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
	DecisionError = "error"
)

// Direction label values of bytes_total: "in" is read from the sandbox (requests and
// uploads), "out" is written to the sandbox (responses and downloads).
const (
	DirectionIn  = "in"
	DirectionOut = "out"
)

// Metrics holds every egressd series and the registry that exports them.
// Label values are reason codes, listener names and credential IDs: never secrets.
type Metrics struct {
	Registry          *prometheus.Registry
	Requests          *prometheus.CounterVec   // requests_total{listener,decision,reason}
	Duration          *prometheus.HistogramVec // request_duration_seconds{listener}
	TunnelsActive     prometheus.Gauge         // tunnels_active
	Bytes             *prometheus.CounterVec   // bytes_total{direction}
	CredentialRefresh *prometheus.CounterVec   // credential_refresh_total{credential,result}
	CredentialAge     *prometheus.GaugeVec     // credential_age_seconds{credential}
	LeafCache         *prometheus.CounterVec   // leaf_cache_total{result}
	HookRequests      *prometheus.CounterVec   // hook_requests_total{event,outcome}
	ConfigReloads     *prometheus.CounterVec   // config_reloads_total{result}
	Scrubbed          *prometheus.CounterVec   // scrubbed_total{rule}
	OAuthRefresh      *prometheus.CounterVec   // oauth_refresh_total{credential,result}
	CredentialMint    *prometheus.CounterVec   // credential_mint_total{credential,result}
	// MemoryBudget is memory_budget_bytes{holder}, read from the budget when
	// scraped (ObserveMemory); MemoryBudgetLimit is memory_budget_limit_bytes.
	MemoryBudget      *pulledGaugeVec
	MemoryBudgetLimit prometheus.GaugeFunc
	// CredentialReady is credential_ready{credential}: 1 when the credential can be
	// served now, else 0, read when scraped (ObserveCredentials).
	CredentialReady *readyGaugeVec
	CAExpiry        prometheus.Gauge     // ca_expiry_timestamp_seconds
	BuildInfo       *prometheus.GaugeVec // build_info{version,commit,go}: always 1

	memory atomic.Pointer[memorySource] // ObserveMemory's budget
}

// New registers every series on a fresh registry, with Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_requests_total", Help: "Requests and tunnels by listener, decision and reason code.",
		}, []string{"listener", "decision", "reason"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "egressd_request_duration_seconds", Help: "Time from request head to the end of the response or tunnel.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"listener"}),
		TunnelsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "egressd_tunnels_active", Help: "CONNECT and transparent tunnels currently open.",
		}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_bytes_total", Help: "Bytes read from (in) and written to (out) the sandbox.",
		}, []string{"direction"}),
		CredentialRefresh: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_credential_refresh_total", Help: "Credential reads by credential ID and result.",
		}, []string{"credential", "result"}),
		CredentialAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "egressd_credential_age_seconds", Help: "Seconds since the credential was last read successfully.",
		}, []string{"credential"}),
		LeafCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_leaf_cache_total", Help: "Leaf certificate cache lookups by result (hit, miss).",
		}, []string{"result"}),
		HookRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_hook_requests_total", Help: "Hook calls by event and outcome.",
		}, []string{"event", "outcome"}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_config_reloads_total", Help: "Config reloads by result (ok, error).",
		}, []string{"result"}),
		Scrubbed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_scrubbed_total", Help: "Responses in which egressd masked a value it had injected, by allowlist rule.",
		}, []string{"rule"}),
		OAuthRefresh: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_oauth_refresh_total", Help: "oauth2 token calls by credential ID and result (ok, error).",
		}, []string{"credential", "result"}),
		CredentialMint: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "egressd_credential_mint_total", Help: "Short-lived keys or tokens egressd mints for a credential (github_app installation tokens, aws keys read from Vault's AWS secrets engine), by credential ID and result (ok, error).",
		}, []string{"credential", "result"}),
	}
	m.MemoryBudget = &pulledGaugeVec{GaugeVec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressd_memory_budget_bytes", Help: "Bytes of the memory budget (limits.memory) each holder holds.",
	}, []string{"holder"}), src: &m.memory}
	m.MemoryBudgetLimit = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "egressd_memory_budget_limit_bytes", Help: "The memory budget's size in bytes (limits.memory, auto resolved).",
	}, m.budgetLimit)
	m.CredentialReady = &readyGaugeVec{GaugeVec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressd_credential_ready", Help: "1 when the credential can be served now (read, not stale, an oauth2 access token held), else 0.",
	}, []string{"credential"})}
	m.CAExpiry = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressd_ca_expiry_timestamp_seconds", Help: "When the interception CA's certificate expires (Unix seconds).",
	})
	m.BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressd_build_info", Help: "Always 1; the labels say which egressd this is.",
	}, []string{"version", "commit", "go"})
	m.Registry.MustRegister(m.Requests, m.Duration, m.TunnelsActive, m.Bytes, m.CredentialRefresh,
		m.CredentialAge, m.LeafCache, m.HookRequests, m.ConfigReloads, m.Scrubbed, m.OAuthRefresh,
		m.CredentialMint, m.MemoryBudget, m.MemoryBudgetLimit, m.CredentialReady, m.CAExpiry, m.BuildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.initKnown()
	return m
}

// initKnown creates the label sets that exist regardless of traffic, so they export zeros.
func (m *Metrics) initKnown() {
	for _, d := range []string{DirectionIn, DirectionOut} {
		m.Bytes.WithLabelValues(d)
	}
	for _, r := range []string{"hit", "miss"} {
		m.LeafCache.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		m.ConfigReloads.WithLabelValues(r)
	}
	for _, h := range membudget.Holders() {
		m.MemoryBudget.WithLabelValues(h.String())
	}
}

// InitRules exports zero values of scrubbed_total for the rules that inject (the
// only ones whose responses are scrubbed).
func (m *Metrics) InitRules(rules []string) {
	for _, r := range rules {
		m.Scrubbed.WithLabelValues(r)
	}
}

// InitListener exports zero values for a listener's decision and reason label
// sets: every reason of allowlist.Reasons, a denial as deny, a failure as error.
func (m *Metrics) InitListener(name string) {
	m.Requests.WithLabelValues(name, DecisionAllow, "")
	for _, r := range allowlist.Reasons {
		decision := DecisionError
		if r.IsDenial() {
			decision = DecisionDeny
		}
		m.Requests.WithLabelValues(name, decision, string(r))
	}
	m.Duration.WithLabelValues(name)
}

// ObserveMemory makes every scrape read the memory budget from b: what each holder
// holds (hookBodies, when set, reports the hook bodies buffered rather than their
// standing share) and the budget's size. A nil *Metrics (tests) ignores it.
func (m *Metrics) ObserveMemory(b *membudget.Budget, hookBodies func() int64) {
	if m == nil {
		return
	}
	m.memory.Store(&memorySource{b: b, hookBodies: hookBodies})
}

type memorySource struct {
	b          *membudget.Budget
	hookBodies func() int64
}

func (s *memorySource) held(h membudget.Holder) int64 {
	if h == membudget.HookBodies && s.hookBodies != nil {
		return s.hookBodies()
	}
	return s.b.Held(h)
}

// budgetLimit is memory_budget_limit_bytes: 0 until ObserveMemory.
func (m *Metrics) budgetLimit() float64 {
	if src := m.memory.Load(); src != nil {
		return float64(src.b.Limit())
	}
	return 0
}

// pulledGaugeVec is memory_budget_bytes: its values are read from the budget
// when scraped, so that reserving and releasing memory costs no metric update.
type pulledGaugeVec struct {
	*prometheus.GaugeVec
	src *atomic.Pointer[memorySource]
}

func (p *pulledGaugeVec) Collect(ch chan<- prometheus.Metric) {
	if src := p.src.Load(); src != nil {
		for _, h := range membudget.Holders() {
			p.WithLabelValues(h.String()).Set(float64(src.held(h)))
		}
	}
	p.GaugeVec.Collect(ch)
}

// SetBuild exports build_info{version,commit,go} = 1.
func (m *Metrics) SetBuild(version, commit string) {
	m.BuildInfo.WithLabelValues(version, commit, runtime.Version()).Set(1)
}

// ObserveCredentials makes every scrape read credential_ready from ready: the
// credentials of the config in force, each true when it can be served now.
func (m *Metrics) ObserveCredentials(ready func() map[string]bool) {
	m.CredentialReady.src.Store(&ready)
}

// readyGaugeVec is credential_ready: read when scraped, so that a credential going
// stale between two reads, or one a reload removed, shows at once.
type readyGaugeVec struct {
	*prometheus.GaugeVec
	src atomic.Pointer[func() map[string]bool]
	mu  sync.Mutex // one scrape's reset and values at a time
}

func (r *readyGaugeVec) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if src := r.src.Load(); src != nil {
		r.Reset()
		for id, ok := range (*src)() {
			v := 0.0
			if ok {
				v = 1
			}
			r.WithLabelValues(id).Set(v)
		}
	}
	r.GaugeVec.Collect(ch)
}
