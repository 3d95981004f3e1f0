package vault

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/hashicorp/vault/api"
)

// statusError is Vault's answer to a failed call: the operation, the path, the HTTP status
// and Vault's own error strings. It never holds a response body Vault did not format
// (api.ResponseError.RawError), nor any value egressd sent (scrubbed at construction).
type statusError struct {
	op, path string
	status   int
	msgs     []string
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("%s %s: HTTP %d", e.op, e.path, e.status)
	if len(e.msgs) > 0 {
		msg += ": " + strings.Join(e.msgs, "; ")
	}
	return msg
}

// maxVaultMessage bounds one of Vault's error strings in an error: long enough for every
// message Vault formats, short enough that an error stays one line.
const maxVaultMessage = 200

// describe turns an error of the api package from op ("vault read", "PUT") on path into one
// that is safe to log:
// Vault's status and error strings, or the transport error (which names the URL and the
// network failure). sent are values egressd put in the request (a secret ID, a JWT, a token):
// they are cut out of the text, should Vault ever echo one.
func describe(op, path string, err error, sent ...string) error {
	var re *api.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s %s: %s", op, path, scrub(err.Error(), sent))
	}
	se := &statusError{op: op, path: path, status: re.StatusCode}
	if re.RawError {
		se.msgs = []string{"(response body not in Vault's error format; not shown)"}
		return se
	}
	for _, m := range re.Errors {
		m = strings.Join(strings.Fields(scrub(m, sent)), " ")
		if len(m) > maxVaultMessage {
			m = m[:maxVaultMessage] + "..."
		}
		se.msgs = append(se.msgs, m)
	}
	return se
}

// scrub replaces every occurrence of each value in s.
func scrub(s string, values []string) string {
	for _, v := range values {
		if len(v) >= 4 {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// hasStatus reports whether err is Vault's answer with the given status.
func hasStatus(err error, status int) bool {
	var se *statusError
	return errors.As(err, &se) && se.status == status
}

// isForbidden reports whether Vault refused the token: missing policy, or a token that is
// expired, revoked or unknown (Vault does not tell them apart; token lookup-self does).
func isForbidden(err error) bool { return hasStatus(err, http.StatusForbidden) }
