package credential

import "errors"

// ErrNotFound is what a Backend returns, wrapped or not, when it answered and the ID is not
// there (a file that parsed without the ID, a KV path that does not exist). The Store makes
// such an ID unavailable at once.
var ErrNotFound = errors.New("credential not found")

// ErrInvalid is wrapped by every error ParseSecret returns: the backend answered, but the
// secret's shape is wrong. The Store makes such an ID unavailable at once.
var ErrInvalid = errors.New("invalid credential secret")

// ErrUnavailable matches every *UnavailableError with errors.Is.
var ErrUnavailable = errors.New("credential unavailable")

// Causes of an UnavailableError: stable codes for logs and Status.
const (
	CauseNotFound  = "not_found"  // the last read answered without the ID
	CauseInvalid   = "invalid"    // the last read found a secret of a bad shape
	CauseNeverRead = "never_read" // no read of the ID has succeeded yet
	CauseStale     = "stale"      // no good read within MaxStale
	CauseRevoked   = "revoked"    // the secret's status is "revoked"
	// CauseNoAccessToken: an oauth2 credential has no unexpired access token (the token
	// endpoint has not answered yet, or has failed past the last token's expiry).
	CauseNoAccessToken = "no_access_token"
	// CauseNoAWSKeys: a vault_aws credential has no unexpired keys (Vault's AWS secrets
	// engine has not answered yet, or has failed past the last keys' expiry).
	CauseNoAWSKeys = "no_aws_keys"
)

// UnavailableError is returned by Store.Get when a credential cannot be served: never read,
// absent from a backend that answered, of an invalid shape, or without a good read within
// MaxStale. Its message names the ID and the cause class, never a value (Err comes from a
// backend, whose errors never carry values either). errors.Is(err, ErrUnavailable) is true;
// errors.Is also reaches Err (ErrNotFound, ErrInvalid, a backend error).
type UnavailableError struct {
	ID    string
	Cause string // CauseNotFound, CauseInvalid, CauseNeverRead, CauseStale, CauseRevoked (or the token manager's)
	Err   error  // the last read's error; nil when there was none
}

// Error returns e.g. "credential example-api unavailable (stale): open creds.json: no such file or directory".
func (e *UnavailableError) Error() string {
	msg := "credential " + e.ID + " unavailable (" + e.Cause + ")"
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the last read's error.
func (e *UnavailableError) Unwrap() error { return e.Err }
