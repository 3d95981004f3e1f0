package oauth

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"golang.org/x/oauth2"
)

// styleKey is one client at one token endpoint: what a client authentication is learnt
// for. The client is part of it because an endpoint may register each client with its own
// method (RFC 7591 token_endpoint_auth_method).
type styleKey struct{ tokenURL, clientID string }

// learnt is what is known of a styleKey's client authentication.
type learnt struct {
	style oauth2.AuthStyle // the style of the next call
	sure  bool             // a call in style succeeded: it is never changed again
}

// authStyles is the Manager's memory of client authentication, shared by every credential
// of the same client and kept when a credential's secret changes.
type authStyles struct {
	mu sync.Mutex
	m  map[styleKey]learnt
}

func (a *authStyles) get(k styleKey) (learnt, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.m[k]
	return l, ok
}

func (a *authStyles) set(k styleKey, l learnt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m[k] = l
}

// exchange makes one attempt's token call in the style learnt for st's endpoint and client.
// Before anything is learnt it sends HTTP Basic (RFC 6749 §2.3.1: every server supports it)
// and, only when the endpoint refuses the client in a way that tells (refusesClient), the
// form in the same attempt: the one attempt that makes two calls. After that every attempt
// is one call; a style that has not yet worked is swapped for the other after a refusal
// (the secret may be what is wrong), one that has worked is kept.
func (m *Manager) exchange(ctx context.Context, st *state) (*oauth2.Token, error) {
	k := styleKey{st.secret.TokenURL, st.secret.ClientID}
	l, known := m.styles.get(k)
	if !known {
		l.style = oauth2.AuthStyleInHeader
	}
	tok, err := m.call(ctx, st, l.style)
	switch {
	case err == nil:
		if !l.sure {
			m.styles.set(k, learnt{style: l.style, sure: true})
			m.o.Log.Info().Str("credential", st.id).Str("token_url", k.tokenURL).Str("client_auth", styleName(l.style)).
				Msg("oauth2 client authentication learnt")
		}
		return tok, nil
	case l.sure || !refusesClient(err):
		return nil, err
	}
	m.styles.set(k, learnt{style: otherStyle(l.style)})
	if known {
		return nil, err
	}
	return m.exchange(ctx, st)
}

// refusesClient reports whether the endpoint refused the client's authentication, which
// may be the style's fault: RFC 6749 §5.2 invalid_client (or a bare 401), and
// invalid_request, which endpoints that ignore the Authorization header answer for a
// request they find without client_id. A 5xx, a timeout or a refused connection says
// nothing about the style.
func refusesClient(err error) bool {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		return false
	}
	unauthorized := re.Response != nil && re.Response.StatusCode == http.StatusUnauthorized
	return unauthorized || re.ErrorCode == "invalid_client" || re.ErrorCode == "invalid_request"
}

func otherStyle(s oauth2.AuthStyle) oauth2.AuthStyle {
	if s == oauth2.AuthStyleInHeader {
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleInHeader
}

// styleName is a style as logs and docs/policy.md name it.
func styleName(s oauth2.AuthStyle) string {
	if s == oauth2.AuthStyleInHeader {
		return "basic"
	}
	return "form"
}
