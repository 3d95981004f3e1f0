package inject

import (
	"context"
	"net/http"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/sigv4"
)

// AWSPlaceholders gives the placeholder access key ID the sandbox signs an aws
// credential's requests with (placeholder.Replacer).
type AWSPlaceholders interface {
	AWSKeyID(id string) (string, bool)
}

// awsSigning is what Sign needs of an aws credential that Apply read.
type awsSigning struct {
	keys  *credential.AWS
	scope *allowlist.AWSScope
}

// Sign signs out again (SigV4) with the real keys of the aws credential Apply read, once
// every other stage has changed out for the last time; nothing for any other credential.
// A request not signed with the credential's placeholder key, or not for a region and
// service the entry allows, is refused with a *sigv4.ScopeError (credential_scope). hold
// reserves a body read whole to hash it (sigv4.Request.Hold).
func (res Result) Sign(ctx context.Context, out *http.Request, host string, phs AWSPlaceholders, hold func(int64) error) error {
	if res.aws == nil {
		return nil
	}
	keyID, _ := phs.AWSKeyID(res.Credential)
	a := res.aws.keys
	return sigv4.Sign(ctx, sigv4.Request{
		Out: out, Credential: res.Credential, Host: host, Scope: res.aws.scope, Placeholder: keyID,
		Keys: sigv4.Keys{AccessKeyID: a.AccessKeyID, SecretAccessKey: a.SecretAccessKey, SessionToken: a.SessionToken},
		Now:  time.Now(), Hold: hold,
	})
}

// awsSecrets are the aws keys as headers for the scrub Set only: masked in responses,
// never set (the signature carries them; Sign sets its own headers).
func awsSecrets(a *credential.AWS) []credential.Header {
	var out []credential.Header
	for _, s := range a.Secrets() {
		out = append(out, credential.Header{Value: s})
	}
	return out
}
