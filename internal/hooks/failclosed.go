package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Decisions a policy endpoint may answer with.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Deadline margins: the deny is sent no later than the hook's timeout minus
// 0.5 s, so that it reaches the runtime before the runtime gives up and reads
// the silence as allow (docs/hooks.md).
const (
	// DeadlineMargin is subtracted from the hook's timeout, so that egressd's deny
	// reaches the runtime before the runtime gives up, which it would count as allow.
	DeadlineMargin = 500 * time.Millisecond
	// MinDeadline is the floor for very short timeouts: egressd still tries the
	// endpoint for this long. A hook timeout shorter than DeadlineMargin+MinDeadline
	// may then lose the race to the runtime, which lint cannot prevent.
	MinDeadline = 100 * time.Millisecond
)

// DecisionError is why an endpoint's answer is not a well-formed allow or deny. Its
// text is short and names what failed, for the deny's reason: "endpoint returned 500",
// "response is not JSON", `unknown decision "maybe"`.
type DecisionError struct{ Msg string }

func (e *DecisionError) Error() string { return e.Msg }

func decisionErr(format string, args ...any) error {
	return &DecisionError{Msg: fmt.Sprintf(format, args...)}
}

// Deadline is how long egressd waits for a pre_tool_execution endpoint whose hook has
// the given timeout: timeout minus DeadlineMargin, at least MinDeadline.
func Deadline(timeout time.Duration) time.Duration {
	return max(timeout-DeadlineMargin, MinDeadline)
}

// DenyBody is the answer egressd gives the runtime in place of a failed pre-tool call,
// with status 200: {"decision":"deny","reason":"egressd: <reason> (fail-closed)"}.
func DenyBody(reason string) []byte {
	b, _ := json.Marshal(struct {
		Decision string `json:"decision"`
		Reason   string `json:"reason"`
	}{DecisionDeny, "egressd: " + reason + " (fail-closed)"})
	return b
}

// CheckDecision returns nil only for a 2xx status with a body, of at most limit bytes,
// that is one JSON object whose "decision" is exactly "allow" or "deny" (other fields,
// such as a deny's "reason", are allowed). Every other answer is a *DecisionError.
func CheckDecision(status int, body []byte, limit int64) error {
	_, err := Verdict(status, body, limit)
	return err
}

// Verdict is CheckDecision that also returns the decision ("allow" or "deny") when
// there is no error, for metrics and logs.
func Verdict(status int, body []byte, limit int64) (string, error) {
	switch {
	case status < 200 || status > 299:
		return "", decisionErr("endpoint returned %d", status)
	case int64(len(body)) > limit:
		return "", decisionErr("response larger than %d bytes", limit)
	case len(bytes.TrimSpace(body)) == 0:
		return "", decisionErr("empty response")
	}
	return decision(body)
}

// decision reads the "decision" of a JSON object. A repeated "decision" key is refused,
// also when the two differ in case: JSON parsers differ on which one wins and on whether
// keys match without case, and the runtime's might not pick egressd's.
func decision(body []byte) (string, error) {
	if !json.Valid(body) {
		return "", decisionErr("response is not JSON")
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, _ := d.Token(); tok != json.Delim('{') {
		return "", decisionErr("response is not a JSON object")
	}
	var value json.RawMessage
	found, dupCase := false, false
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return "", decisionErr("response is not JSON")
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return "", decisionErr("response is not JSON")
		}
		key, _ := tok.(string)
		switch {
		case !strings.EqualFold(key, "decision"):
		case found || dupCase:
			return "", decisionErr(`response has "decision" twice`)
		case key == "decision":
			value, found = v, true
		default:
			dupCase = true // "Decision": some parsers match keys without case
		}
	}
	if _, err := d.Token(); err != nil && !errors.Is(err, io.EOF) {
		return "", decisionErr("response is not JSON")
	}
	if !found {
		return "", decisionErr(`response has no "decision"`)
	}
	var s string
	if bytes.Equal(value, []byte("null")) || json.Unmarshal(value, &s) != nil {
		return "", decisionErr(`"decision" is not a string`)
	}
	if s != DecisionAllow && s != DecisionDeny {
		return "", decisionErr("unknown decision %q", truncate(s, 40))
	}
	return s, nil
}

// truncate shortens s to n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
