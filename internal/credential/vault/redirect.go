package vault

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/hashicorp/vault/api"
)

// RedirectError is a Vault answer that redirects (3xx). egressd never follows one: vault/api
// would follow a redirect to any origin and send the X-Vault-Token header (and a login's
// secret ID or JWT) there, and net/http strips Authorization across hosts, never that
// header. The request fails instead, so the credential is served from its last good value
// until max_stale and is then unavailable.
type RedirectError struct {
	Status int
	Target string // the Location's origin (scheme://host), "" when there is none
}

func (e *RedirectError) Error() string {
	to := "without a Location"
	if e.Target != "" {
		to = "to " + e.Target
	}
	return fmt.Sprintf("vault answered HTTP %d, a redirect %s; egressd never follows Vault redirects "+
		"(they would carry the Vault token): set credentials.vault.address to the Vault server itself "+
		"(the active node, or a load balancer that forwards)", e.Status, to)
}

// refuseRedirects makes cfg's client fail on every redirect before anything is sent to
// its target: vault/api's own following is off (DisableRedirects, the knob vault/api has
// for this), net/http's stays off (DefaultConfig's CheckRedirect), and a 3xx response is
// turned into a *RedirectError where vault/api would otherwise take it for an empty
// success ("no secret here").
func refuseRedirects(cfg *api.Config) {
	cfg.DisableRedirects = true
	next := cfg.CheckRetry
	if next == nil {
		next = api.DefaultRetryPolicy
	}
	cfg.CheckRetry = failOnRedirect(next)
}

// failOnRedirect wraps the retry policy next: a 3xx response ends the request with a
// *RedirectError, and is never retried.
func failOnRedirect(next retryablehttp.CheckRetry) retryablehttp.CheckRetry {
	return func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if resp != nil && resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return false, &RedirectError{Status: resp.StatusCode, Target: origin(resp.Header.Get("Location"))}
		}
		return next(ctx, resp, err)
	}
}

// origin is the scheme and host of a Location, never its path or query.
func origin(loc string) string {
	u, err := url.Parse(loc)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}
