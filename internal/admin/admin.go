// Package admin serves egressd's operator endpoints: health, readiness and metrics
// (Health, for probes and Prometheus), and with them explain, reload, the sandbox's
// placeholders, the CA and the JWKS (Handler, the admin listener's, behind a Bearer
// token when one is set). It listens on the admin and health addresses, never on a
// sandbox listener.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/internal/explain"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/proxy"
)

// State is what the admin endpoints read from the running process.
type State interface {
	Snapshot() *proxy.Snapshot
	ConfigInfo() (hash string, loaded time.Time)
	// LastReload is the outcome of the last reload; the zero value before any.
	LastReload() ReloadStatus
	Ready() (bool, map[string]any)
	// JWKS is the hook assertion keys as a JWK Set; nil when there are none.
	JWKS() []byte
	// CAPEM is the interception CA certificate (PEM) clients must trust.
	CAPEM() []byte
	// Reload reloads the config as SIGHUP does and returns the hash of the config in
	// force. When the new config is rejected the running one stays in force and the
	// error says why, as a *config.ValidationError when it can.
	Reload() (hash string, err error)
}

// ReloadStatus is the outcome of a reload, as /healthz and /readyz show it. A
// rejected reload leaves the last good config serving, so neither endpoint fails on
// it (a restart would load the same bad file); they say so instead.
type ReloadStatus struct {
	Result string    `json:"result"`          // "ok" or "error"
	Source string    `json:"source"`          // sighup, admin or file
	At     time.Time `json:"at"`              // when it finished
	Error  string    `json:"error,omitempty"` // why it was rejected: paths and messages, never values
}

// lastReload is the "last_reload" member of the health bodies: null before any.
func lastReload(st State) any {
	if r := st.LastReload(); r.Result != "" {
		return r
	}
	return nil
}

// Health returns the health listener's handler: /healthz, /readyz and /metrics,
// and nothing else, so it may be reachable beyond the pod.
func Health(st State, m *metrics.Metrics) http.Handler {
	mux := http.NewServeMux()
	health(mux, st, m)
	return mux
}

func health(mux *http.ServeMux, st State, m *metrics.Metrics) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		hash, loaded := st.ConfigInfo()
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "config_hash": hash, "config_loaded": loaded.UTC(),
			"last_reload": lastReload(st)})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, detail := st.Ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		body := map[string]any{"ready": ok, "last_reload": lastReload(st)}
		for k, v := range detail {
			if k != "ready" {
				body[k] = v
			}
		}
		writeJSON(w, code, body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
}

// Handler returns the admin listener's handler: every endpoint, health's included
// unless withHealth is false (they are on their own listener, admin.health_address).
func Handler(st State, m *metrics.Metrics, withHealth bool) http.Handler {
	mux := http.NewServeMux()
	if withHealth {
		health(mux, st, m)
	}
	mux.HandleFunc("GET /v1/sandbox/env", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, st.Snapshot().Placeholders.Env())
	})
	mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write(st.CAPEM())
	})
	mux.HandleFunc("GET /.well-known/jwks.json", func(w http.ResponseWriter, _ *http.Request) {
		keys := st.JWKS()
		if keys == nil {
			keys = []byte(`{"keys":[]}`)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=60")
		w.Write(keys)
	})
	mux.HandleFunc("GET /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		raw := r.URL.Query().Get("url")
		if raw == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "missing url parameter"})
			return
		}
		snap := st.Snapshot()
		res := explain.URL(snap.Policy, snap.Guard, snap.Env, raw)
		creds := snap.Injector.Credentials()
		res = explain.Credential(res, explain.FromStore(creds))
		writeJSON(w, http.StatusOK, explain.Placeholders(res, snap.Placeholders.Vars(), explain.EnvFromStore(creds)))
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, _ *http.Request) {
		reload(w, st)
	})
	return mux
}

// WithToken makes every request to h carry "Authorization: Bearer <token>", the
// token being what token returns now (it may rotate); anything else is 401. A token
// that cannot be read refuses every request (503): the admin listener never opens
// because its secret is missing.
func WithToken(h http.Handler, token func() ([]byte, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want, err := token()
		if err != nil || len(want) == 0 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "admin.token cannot be read"})
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="egressd admin"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin.token required: Authorization: Bearer <token>"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// WithPprof adds net/http/pprof's handlers under /debug/pprof/ to h
// (admin.pprof). They are never on the default mux, so nothing else serves them.
func WithPprof(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// reload serves POST /v1/reload: 200 {"result":"ok","config_hash":...} once the new
// config is in force, or 422 {"result":"error","problems":[...]} when it was rejected
// and the running config stays in force. A rejected config is the client's problem to
// fix, never a 5xx. Concurrent calls wait for each other (the State serialises them).
func reload(w http.ResponseWriter, st State) {
	hash, err := st.Reload()
	if err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"result": "error", "problems": problems(err)})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"result": "ok", "config_hash": hash})
}

// problems lists why a reload was rejected, each with its path and file when known.
func problems(err error) []config.Problem {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		return verr.Problems
	}
	return []config.Problem{{Msg: err.Error()}}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
