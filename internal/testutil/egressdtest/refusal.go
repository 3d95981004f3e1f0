package egressdtest

// Refusal is the JSON body of a response egressd makes itself: a denial or an
// error (docs/reasons.md).
type Refusal struct {
	Error     string `json:"error"` // egress_denied, or the error class
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
}
