package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/egressd/egressd/internal/config"
)

// maxSpecBytes bounds a PUT body: a spec is a policy and a few listeners.
const maxSpecBytes = 1 << 20

// Handler is the node API: PUT, GET and DELETE /v1/sandboxes/{id}, and GET
// /v1/sandboxes for the list. Whoever can open the socket may use it: the socket's
// permissions are its authentication (ListenSocket).
func (r *Registry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/sandboxes/{id}", r.put)
	mux.HandleFunc("GET /v1/sandboxes/{id}", r.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", r.delete)
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string][]string{"sandboxes": r.IDs()})
	})
	return mux
}

// put registers or changes a sandbox: 201 new, 200 changed (or the same spec
// again), 400 with every problem when the spec has an error.
func (r *Registry) put(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxSpecBytes))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, problemsBody{[]config.Problem{{Msg: fmt.Sprintf("reading the spec: %v (at most %d bytes)", err, maxSpecBytes)}}})
		return
	}
	res, problems := r.Apply(id, data, "", SourceAPI)
	r.logApply(id, "", res, problems)
	status := map[Result]int{Refused: http.StatusBadRequest, Failed: http.StatusBadRequest, Created: http.StatusCreated, Changed: http.StatusOK, Unchanged: http.StatusOK}[res]
	writeJSON(w, status, problemsBody{nonNil(problems)})
}

func (r *Registry) get(w http.ResponseWriter, req *http.Request) {
	info, ok := r.Get(req.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such sandbox"})
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// delete removes a sandbox, closing its connections: 204, or 404 for an unknown ID.
func (r *Registry) delete(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	if !r.Remove(id, "") {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such sandbox"})
		return
	}
	r.log.Info().Str("sandbox", id).Str("source", SourceAPI).Msg("sandbox removed")
	w.WriteHeader(http.StatusNoContent)
}

// problemsBody is the body of PUT's answers.
type problemsBody struct {
	Problems []config.Problem `json:"problems"`
}

func nonNil(ps []config.Problem) []config.Problem {
	if ps == nil {
		return []config.Problem{}
	}
	return ps
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// logApply logs what a spec did: INFO when in force, WARN with the problems when
// refused.
func (r *Registry) logApply(id, file string, res Result, problems []config.Problem) {
	source := SourceAPI
	if file != "" {
		source = SourceDir
	}
	strs := make([]string, len(problems))
	for i, p := range problems {
		strs[i] = p.String()
	}
	switch res {
	case Refused, Failed:
		r.log.Warn().Str("sandbox", id).Str("source", source).Str("file", file).Strs("problems", strs).
			Msg("sandbox spec refused; the sandbox keeps what it had")
	case Created, Changed:
		r.log.Info().Str("sandbox", id).Str("source", source).Str("file", file).Bool("new", res == Created).
			Strs("warnings", strs).Msg("sandbox spec in force")
	}
}

// ListenSocket opens the node API's Unix socket at path: its directory is created
// 0700 where missing, a stale socket left by a previous run is replaced, and the
// socket is made 0600, so only egressd's own user reaches the API.
func ListenSocket(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("node.api_socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	} else if err == nil {
		return nil, fmt.Errorf("node.api_socket: %s exists and is not a socket", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("node.api_socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("node.api_socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("node.api_socket: %w", err)
	}
	return ln, nil
}
