package proxy

import (
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/egressd/egressd/internal/config"
	"github.com/egressd/egressd/pkg/hookauth"
)

// The runtime treats a failed pre-tool call as "allow", and the sandbox can send
// anything a hook call looks like, so a request to a hook URL is a hook call only
// when egressd can tell it came from the runtime, as hooks.identify says
// (docs/hooks.md): it came in on a role: hooks listener the sandbox cannot reach,
// it (or its tunnel's CONNECT) presented the runtime's own token as
// Proxy-Authorization, or, chosen explicitly, by its URL alone. The assertion's
// ident claim says which applied.

// callIdent is the ident of a call to a hook URL on a listener of role, whose
// request or tunnel was identified as authIdent (authIdent); "" when it is not
// the runtime's call.
func (h *Hooks) callIdent(role, authIdent string) string {
	switch h.Identify {
	case config.IdentifyListener:
		if role == config.RoleHooks {
			return hookauth.IdentListener
		}
		return ""
	case config.IdentifyRuntimeAuth:
		return authIdent
	}
	return hookauth.IdentURL
}

// authIdent is what a request's (or a CONNECT's) Proxy-Authorization says under
// identify runtime_auth: hookauth.IdentRuntimeAuth when it carries the runtime's
// token, IdentURL when the token cannot be had (the call is then told by its URL,
// and failed closed, rather than forwarded as anyone's request), else "".
func (h *Hooks) authIdent(header http.Header) string {
	if h == nil || h.Identify != config.IdentifyRuntimeAuth || h.RuntimeToken == nil {
		return ""
	}
	token, err := h.RuntimeToken()
	switch {
	case err != nil:
		return hookauth.IdentURL
	case presents(header.Values("Proxy-Authorization"), token):
		return hookauth.IdentRuntimeAuth
	}
	return ""
}

// presents reports whether one of the Proxy-Authorization values carries token:
// "Bearer <token>", or Basic credentials whose password is the token (a proxy
// URL such as http://runtime:<token>@egressd:15003, which clients send as Basic).
func presents(values []string, token []byte) bool {
	ok := false
	for _, v := range values {
		scheme, cred, _ := strings.Cut(strings.TrimSpace(v), " ")
		cred = strings.TrimSpace(cred)
		switch {
		case strings.EqualFold(scheme, "Bearer"):
			ok = equalSecret([]byte(cred), token) || ok
		case strings.EqualFold(scheme, "Basic"):
			raw, err := base64.StdEncoding.DecodeString(cred)
			if _, pass, found := strings.Cut(string(raw), ":"); err == nil && found {
				ok = equalSecret([]byte(pass), token) || ok
			}
		}
	}
	return ok
}

// equalSecret compares in constant time; an empty token matches nothing.
func equalSecret(a, token []byte) bool {
	return len(token) > 0 && subtle.ConstantTimeCompare(a, token) == 1
}
