// Command policy-endpoint is a minimal pre_tool_execution policy endpoint for agent hooks
// behind egressd. It verifies egressd's Egressd-Hook-Assertion with pkg/hookauth
// (keys from egressd's JWKS on the admin listener), denies code_execution calls whose
// arguments mention curl, and allows the rest.
//
// It fails closed on its own: a missing or invalid assertion, an unreadable body or a
// tool call it cannot parse is answered with 200 {"decision": "deny"}, never with an
// error status, because the agent runtime treats every non-2xx answer as allow.
//
//	go run ./examples/policy-endpoint -audience https://policy.example.com \
//	    -jwks http://127.0.0.1:15000/.well-known/jwks.json
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/egressd/egressd/pkg/hookauth"
)

// maxBody bounds the hook call's body, as egressd's limits.hook_body_bytes does.
const maxBody = 1 << 20

func main() {
	fs := flag.NewFlagSet("policy-endpoint", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:8787", "address to serve on")
	jwks := fs.String("jwks", "http://127.0.0.1:15000/.well-known/jwks.json", "egressd's JWKS URL (its admin listener)")
	audience := fs.String("audience", "", "this endpoint's origin as egressd sees it: the scheme://host[:port] of the hook URL in hooks.json (required)")
	env := fs.String("env", "", "egressd's environment ID to require (optional)")
	fs.Parse(os.Args[1:])

	aud, err := hookauth.Origin(*audience)
	if err != nil {
		fmt.Fprintln(os.Stderr, "policy-endpoint: -audience: the hook URL's origin, e.g. https://policy.example.com:", err)
		os.Exit(1)
	}
	v, err := hookauth.NewVerifier(hookauth.Options{Audience: aud, Env: *env, JWKSURL: *jwks})
	if err != nil {
		fmt.Fprintln(os.Stderr, "policy-endpoint:", err)
		os.Exit(1)
	}
	srv := &http.Server{Addr: *listen, Handler: &endpoint{v: v}, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("policy endpoint on %s, audience %s, keys from %s", *listen, aud, *jwks)
	log.Fatal(srv.ListenAndServe())
}

// endpoint answers hook calls.
type endpoint struct{ v *hookauth.Verifier }

// answer is the hook decision.
type answer struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
}

// toolCall is the part of the runtime's hook body the rule reads.
type toolCall struct {
	ToolCall *struct {
		Name string          `json:"name"`
		Args json.RawMessage `json:"args"`
	} `json:"tool_call"`
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := e.decide(r)
	log.Printf("%s %s: %s %s", r.Method, r.URL.Path, a.Decision, a.Reason)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a)
}

// decide verifies the call and applies the rule; every failure is a deny.
func (e *endpoint) decide(r *http.Request) answer {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	switch {
	case err != nil:
		return deny("cannot read the request body")
	case len(body) > maxBody:
		return deny("request body larger than " + fmt.Sprint(maxBody) + " bytes")
	}
	claims, err := e.v.Verify(r.Context(), r.Header.Get(hookauth.HeaderName), body)
	if err != nil {
		return deny("not a verified egressd hook call (" + hookauth.Code(err) + ")")
	}
	if claims.Event != hookauth.EventPreTool {
		return answer{Decision: "allow"} // a post hook cannot block; nothing to decide
	}
	name, args, err := parseCall(body)
	if err != nil {
		return deny(err.Error())
	}
	return rule(name, args)
}

// parseCall reads the tool name and arguments of a pre_tool_execution body.
func parseCall(body []byte) (string, string, error) {
	var tc toolCall
	if err := json.Unmarshal(body, &tc); err != nil {
		return "", "", errors.New("the body is not a JSON tool call")
	}
	if tc.ToolCall == nil || tc.ToolCall.Name == "" {
		return "", "", errors.New(`the body has no "tool_call" with a "name"`)
	}
	return tc.ToolCall.Name, string(tc.ToolCall.Args), nil
}

// rule is the policy: no curl from code_execution.
func rule(name, args string) answer {
	if name == "code_execution" && strings.Contains(strings.ToLower(args), "curl") {
		return deny("code_execution may not run curl")
	}
	return answer{Decision: "allow"}
}

func deny(reason string) answer {
	return answer{Decision: "deny", Reason: "policy-endpoint: " + reason}
}
