package proxy

import (
	"errors"
	"io"
	"strings"

	"github.com/egressd/egressd/internal/placeholder"
)

// Placeholders out of scope in what streams: a request body the upstream is reading
// when the placeholder arrives ends there (placeholder.Result.Refused, checked by
// serve), and so does a switched connection (upgradeSource). Both refuse with
// credential_scope and a WARN, like a placeholder found before forwarding
// (replacePlaceholders).

// warnScope logs a placeholder refused outside its scope, naming the credential (when
// known), the host and the location, never the placeholder.
func (x *exchange) warnScope(err error) {
	var se *placeholder.ScopeError
	if errors.As(err, &se) {
		x.srv.log.Warn().Str("req_id", x.rec.ReqID).Str("credential", se.ID).Str("host", se.Host).
			Str("location", se.Location).Msg("credential placeholder outside its scope refused")
	}
}

// upgradeSource is what the upstream of a connection switched to protocol reads from
// the client: src, ended at the first placeholder (placeholder.Replacer.Upgraded),
// which the record and a WARN then name. serveUpgrade closes both sides on it.
func (x *exchange) upgradeSource(src io.Reader, protocol string) io.Reader {
	if !x.snap.Placeholders.Active() {
		return src
	}
	return &scopedStream{r: x.snap.Placeholders.Upgraded(src, x.target.Host, strings.EqualFold(protocol, "websocket")), x: x}
}

// scopedStream records the placeholder that ended a switched connection.
type scopedStream struct {
	r io.Reader
	x *exchange
}

func (s *scopedStream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	var se *placeholder.ScopeError
	if errors.As(err, &se) {
		s.x.warnScope(err)
		s.x.rec.refused(err)
	}
	return n, err
}
