// Package admin serves egressd's operator endpoints: health, readiness, metrics and
// explain. It listens on the admin address, never on a sandbox listener.
package admin

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/egressd/egressd/internal/explain"
	"github.com/egressd/egressd/internal/metrics"
	"github.com/egressd/egressd/internal/proxy"
)

// State is what the admin endpoints read from the running process.
type State interface {
	Runtime() *proxy.Runtime
	ConfigInfo() (hash string, loaded time.Time)
	Ready() (bool, map[string]any)
	// JWKS is the hook assertion keys as a JWK Set; nil when there are none.
	JWKS() []byte
	// CAPEM is the interception CA certificate (PEM) clients must trust.
	CAPEM() []byte
}

// Handler returns the admin HTTP handler.
func Handler(st State, m *metrics.Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		hash, loaded := st.ConfigInfo()
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "config_hash": hash, "config_loaded": loaded.UTC()})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, detail := st.Ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		body := map[string]any{"ready": ok}
		for k, v := range detail {
			if k != "ready" {
				body[k] = v
			}
		}
		writeJSON(w, code, body)
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		raw := r.URL.Query().Get("url")
		if raw == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "missing url parameter"})
			return
		}
		rt := st.Runtime()
		writeJSON(w, http.StatusOK, explain.URL(rt.Policy, rt.Guard, rt.Env, raw))
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
