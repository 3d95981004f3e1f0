package egressdtest

import (
	"io"
	"net/http"
	"strings"
)

// NodeAPI is a client of a node egressd's API socket (docs/node.md): the
// sandboxes registered at /v1/sandboxes/{id}. It keeps its connection alive
// between requests, as an agent runtime's client would.
type NodeAPI struct{ c *http.Client }

// NewNodeAPI talks to the API socket at socket.
func NewNodeAPI(socket string) *NodeAPI {
	tr := &http.Transport{Proxy: nil, DialContext: dialUnix(socket)}
	return &NodeAPI{c: &http.Client{Transport: tr, Timeout: adminTimeout}}
}

// Do sends method to sandbox id with body ("" for none) and returns the
// status and the body of the answer.
func (a *NodeAPI) Do(method, id, body string) (int, []byte, error) {
	req, err := http.NewRequest(method, "http://node/v1/sandboxes/"+id, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, b, err
}
