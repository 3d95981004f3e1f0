package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/inject"
	"github.com/egressd/egressd/internal/netguard"
	"github.com/egressd/egressd/internal/placeholder"
	"github.com/egressd/egressd/internal/proxy/upstream"
	"github.com/egressd/egressd/internal/sigv4"
)

// refusal is a request that ends in an egressd-made response: a denial or a failure.
// Reason and Detail are what the client sees; Err is the cause, logged only.
type refusal struct {
	Reason allowlist.Reason
	Detail string
	Err    error
}

func (e *refusal) Error() string {
	if e.Err != nil {
		return string(e.Reason) + ": " + e.Err.Error()
	}
	return string(e.Reason)
}

func (e *refusal) Unwrap() error { return e.Err }

func deny(reason allowlist.Reason, detail string) *refusal {
	return &refusal{Reason: reason, Detail: detail}
}

func badRequest(detail string, err error) *refusal {
	return &refusal{Reason: allowlist.ReasonBadRequest, Detail: detail, Err: err}
}

// badHost refuses a target whose host does not parse: detail bad_name for a name
// that is not a DNS name (allowlist.ValidateName), else the caller's detail.
func badHost(detail string, err error) *refusal {
	if errors.Is(err, allowlist.ErrBadName) {
		detail = detailBadName
	}
	return badRequest(detail, err)
}

// clientCancelled is the refusal of a request whose client went away before it was
// answered: recorded, never written (serveRequest).
func clientCancelled(err error) *refusal {
	return &refusal{Reason: allowlist.ReasonClientCancelled, Err: err}
}

// detailHTTP2Only names an upstream that accepts only HTTP/2 (upstream.ErrHTTP2Only).
const detailHTTP2Only = "http2_only"

// detailBadName is the bad_request detail of a host that is not a DNS name.
const detailBadName = "bad_name"

// classify is the one place where an error becomes a reason code. Policy denials
// arrive as *refusal; everything else is a failure on the way to the upstream.
func classify(err error) *refusal {
	var r *refusal
	var blocked *netguard.BlockedError
	var dnsErr *netguard.DNSError
	var dialErr *upstream.DialError
	var credErr *credential.UnavailableError
	var scopeErr *placeholder.ScopeError
	var awsErr *sigv4.ScopeError
	switch {
	case errors.As(err, &r):
		return r
	case errors.Is(err, upstream.ErrHTTP2Only):
		return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Detail: detailHTTP2Only, Err: err}
	case errors.Is(err, placeholder.ErrPlaintext):
		return &refusal{Reason: allowlist.ReasonPlaintextCredential, Err: err}
	case errors.As(err, &scopeErr):
		return &refusal{Reason: allowlist.ReasonCredentialScope, Detail: scopeErr.Location, Err: err}
	case errors.As(err, &awsErr):
		return &refusal{Reason: allowlist.ReasonCredentialScope, Detail: awsErr.Detail, Err: err}
	case errors.Is(err, placeholder.ErrSplit):
		return badRequest("placeholder_split", err)
	case errors.As(err, &credErr):
		return &refusal{Reason: allowlist.ReasonCredentialUnavailable, Detail: credErr.Cause, Err: err}
	case errors.Is(err, inject.ErrNoProcessor):
		return &refusal{Reason: allowlist.ReasonCredentialUnavailable, Detail: "no_processor", Err: err}
	case errors.As(err, &blocked):
		return &refusal{Reason: allowlist.ReasonInternalAddress, Detail: string(blocked.Class), Err: err}
	case errors.As(err, &dnsErr):
		return &refusal{Reason: allowlist.ReasonDNSFailure, Err: err}
	case isTLSVerifyError(err):
		return &refusal{Reason: allowlist.ReasonUpstreamTLS, Err: err}
	case errors.As(err, &dialErr):
		return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Err: err}
	case isTimeout(err):
		return &refusal{Reason: allowlist.ReasonUpstreamTimeout, Err: err}
	default:
		return &refusal{Reason: allowlist.ReasonUpstreamUnreachable, Err: err}
	}
}

func isTLSVerifyError(err error) bool {
	var verr *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var alert tls.AlertError
	var rh tls.RecordHeaderError
	return errors.As(err, &verr) || errors.As(err, &unknown) || errors.As(err, &host) ||
		errors.As(err, &invalid) || errors.As(err, &alert) || errors.As(err, &rh)
}

// statusFor maps a reason code to the HTTP status docs/reasons.md assigns it.
func statusFor(r allowlist.Reason) int {
	switch r {
	case allowlist.ReasonBadRequest:
		return http.StatusBadRequest
	case allowlist.ReasonHostMismatch:
		return http.StatusMisdirectedRequest
	case allowlist.ReasonMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case allowlist.ReasonCredentialUnavailable, allowlist.ReasonOverloaded:
		return http.StatusServiceUnavailable
	case allowlist.ReasonDNSFailure, allowlist.ReasonUpstreamUnreachable, allowlist.ReasonUpstreamTLS:
		return http.StatusBadGateway
	case allowlist.ReasonUpstreamTimeout:
		return http.StatusGatewayTimeout
	default:
		return http.StatusForbidden
	}
}

// refusalFor classifies err, records it on rec, and renders the response. A status
// of 0 means the status docs/reasons.md assigns to the reason.
func refusalFor(snap *Snapshot, rec *Record, err error, status int) (int, http.Header, []byte) {
	rf := rec.refused(err)
	code, h, body := refusalResponse(rf, rec, snap.Env)
	if status != 0 {
		code = status
	}
	rec.Status = code
	return code, h, body
}

// refusalPhrase is the reason phrase of a refusal's HTTP/1.1 status line:
// "Forbidden (egressd: not_allowlisted)". Clients that print only the status
// line (pip, Python's urllib and requests' raise_for_status) show the reason too.
func refusalPhrase(code int, r allowlist.Reason) string {
	return http.StatusText(code) + " (egressd: " + string(r) + ")"
}

// errorBody is the JSON body of every egressd-made response.
type errorBody struct {
	Error     string `json:"error"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail,omitempty"`
	Host      string `json:"host"`
	Port      uint16 `json:"port"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
}

// refusalResponse renders a refusal for the client: status, Egressd-Reason and the JSON
// body. Only reason, detail, host and port reach the client; Err stays in the log.
func refusalResponse(rf *refusal, rec *Record, env string) (int, http.Header, []byte) {
	kind := "egress_denied"
	if !rf.Reason.IsDenial() {
		kind = "egress_failed"
	}
	body, _ := json.Marshal(errorBody{
		Error: kind, Reason: string(rf.Reason), Detail: rf.Detail, Host: rec.Host, Port: rec.Port,
		Message: rf.Reason.Message(rec.Host, rec.Port, env, rf.Detail), RequestID: rec.ReqID,
	})
	body = append(body, '\n')
	h := http.Header{
		"Content-Type":   {"application/json"},
		"Content-Length": {strconv.Itoa(len(body))},
		"Egressd-Reason": {string(rf.Reason)},
		"Cache-Control":  {"no-store"},
	}
	return statusFor(rf.Reason), h, body
}
