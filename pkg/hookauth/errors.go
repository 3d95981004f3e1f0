package hookauth

import "errors"

// Error is a verification failure. Code is stable, for logs, metrics and the JSON body
// of Middleware's 401; the errors Verify returns wrap one of the Err values with detail.
type Error struct {
	Code string
	text string
}

func (e *Error) Error() string { return "hookauth: " + e.text }

// The failures, one per check. Match them with errors.Is.
var (
	ErrMissing         = &Error{"missing", "no " + HeaderName + " header"}
	ErrMalformed       = &Error{"malformed", "malformed assertion"}
	ErrAlgorithm       = &Error{"algorithm", "algorithm not allowed (only " + Algorithm + ")"}
	ErrUnknownKey      = &Error{"unknown_key", "unknown key ID"}
	ErrKeysUnavailable = &Error{"keys_unavailable", "cannot fetch the JWKS"}
	ErrSignature       = &Error{"signature", "signature does not verify"}
	ErrIssuer          = &Error{"issuer", "wrong issuer"}
	ErrAudience        = &Error{"audience", "wrong audience"}
	ErrEnv             = &Error{"env", "wrong environment"}
	ErrSandbox         = &Error{"sandbox", "wrong sandbox"}
	ErrExpired         = &Error{"expired", "assertion expired"}
	ErrNotYetValid     = &Error{"not_yet_valid", "assertion issued in the future"}
	ErrBodyMismatch    = &Error{"body_mismatch", "body_sha256 does not match the body"}
	ErrReplay          = &Error{"replay", "assertion replayed (jti seen before)"}
	ErrReplayCacheFull = &Error{"replay_cache_full", "replay cache full"}
	ErrBodyTooLarge    = &Error{"body_too_large", "request body too large"}
)

// Code returns the Code of the Error err wraps, or "error" when it wraps none.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return "error"
}
