package hookauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

type claimsKey struct{}

// ClaimsFromContext returns the claims Middleware verified for this request.
func ClaimsFromContext(ctx context.Context) (*Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(*Claims)
	return c, ok
}

// Middleware verifies the Egressd-Hook-Assertion of every request before next sees it.
// It reads the body (at most Options.MaxBodyBytes; more is 413), verifies the assertion
// against it, and answers a failure itself with 401 and a JSON body
// {"decision": "deny", "reason": ..., "error": "invalid_assertion", "code": ...}. On
// success next gets the request with the body restored and the claims in its context
// (ClaimsFromContext).
//
// To egressd, a 401 is a failed hook call, which it answers with a deny for pre-tool
// hooks. A caller that reaches the endpoint without egressd (the agent runtime itself)
// treats any non-2xx status as allow; an endpoint that must deny on its own should call
// Verify and answer 200 {"decision": "deny"}, as examples/policy-endpoint does.
func Middleware(v *Verifier, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, v.o.MaxBodyBytes))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				refuse(w, http.StatusRequestEntityTooLarge, ErrBodyTooLarge)
				return
			}
			refuse(w, http.StatusBadRequest, err)
			return
		}
		claims, err := v.Verify(r.Context(), r.Header.Get(HeaderName), body)
		if err != nil {
			refuse(w, http.StatusUnauthorized, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), claimsKey{}, claims))
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// refuse writes a failure as JSON.
func refuse(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{
		"decision": "deny",
		"reason":   err.Error(),
		"error":    "invalid_assertion",
		"code":     Code(err),
	})
}
