// Package sigv4 signs again, with the real keys, an AWS request that the sandbox signed
// (SigV4) with its placeholder key pair. It reads the region and service from the inbound
// signature's credential scope, checks that the access key is the placeholder, removes the
// placeholder signature and signs with aws-sdk-go-v2's signer.
//
// Invariant: nothing leaves unless it was signed with the placeholder access key ID and
// for a region and service the allowlist entry allows; a request egressd cannot sign again
// correctly (chunk-signed streaming, a presigned URL) is refused, never forwarded with the
// placeholder signature or half re-signed. The body is streamed: a hex payload hash the
// SDK sent is kept (the service checks the body against it), and only a small body without
// one is read to hash it.
package sigv4

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/egressd/egressd/internal/allowlist"
)

// MaxHashedBody is the largest body read whole to hash it, for a request that carries no
// X-Amz-Content-Sha256 (services other than S3 sign the body's hash without sending it).
const MaxHashedBody = 1 << 20

// Header and query names of SigV4.
const (
	algorithm        = "AWS4-HMAC-SHA256"
	headerDate       = "X-Amz-Date"
	headerToken      = "X-Amz-Security-Token"
	headerContentSHA = "X-Amz-Content-Sha256"
	queryCredential  = "X-Amz-Credential"
)

// Payload hash values S3 accepts instead of a hex hash. The chunk-signed ones carry a
// signature per chunk, chained from the request's: egressd cannot keep them.
const (
	unsignedPayload          = "UNSIGNED-PAYLOAD"
	streamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
	streamingSignedPrefix    = "STREAMING-AWS4-"
)

// Details of a refusal (credential_scope): what the sandbox must change, named in the
// response by allowlist.Reason.Message.
const (
	DetailUnsigned    = "aws_unsigned"     // no SigV4 Authorization header
	DetailKey         = "aws_key"          // signed with another access key than the placeholder
	DetailRegion      = "aws_region"       // the scope's region is not in aws.regions
	DetailService     = "aws_service"      // the scope's service is not in aws.services
	DetailNoScope     = "aws_no_scope"     // the entry has no "aws" block
	DetailChunkSigned = "aws_chunk_signed" // STREAMING-AWS4-HMAC-SHA256-PAYLOAD and the like
	DetailPresigned   = "aws_presigned"    // X-Amz-Credential in the query
	DetailPayload     = "aws_payload"      // no payload hash and a body too large to hash
)

// ScopeError refuses a request to an aws entry's host: credential_scope with Detail.
// Its message names the credential, host and detail, never a key or signature.
type ScopeError struct {
	Credential, Host, Detail string
}

func (e *ScopeError) Error() string {
	return "aws credential " + e.Credential + ": request to " + e.Host + " refused (" + e.Detail + ")"
}

// Keys are the real keys a request is signed with. They are secrets: never log them.
type Keys struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// Request is one re-signing: the outbound request and what it may be signed for.
type Request struct {
	Out         *http.Request
	Credential  string              // the aws credential's ID, for errors and logs
	Host        string              // the policy host, for errors
	Scope       *allowlist.AWSScope // the entry's aws block; nil refuses
	Placeholder string              // the placeholder access key ID the sandbox must sign with
	Keys        Keys
	Now         time.Time
	// Hold reserves n bytes for a body read whole to hash it, until the request ends,
	// or returns the refusal when they cannot be held; nil reserves nothing.
	Hold func(n int64) error
}

// signer is aws-sdk-go-v2's SigV4 signer; it keeps no per-request state.
var signer = v4.NewSigner()

// Sign checks r.Out's placeholder signature and signs it again with r.Keys, in place.
func Sign(ctx context.Context, r Request) error {
	region, service, err := r.check()
	if err != nil {
		return err
	}
	hash, err := r.payloadHash()
	if err != nil {
		return err
	}
	h := r.Out.Header
	for _, name := range []string{"Authorization", headerDate, headerToken} {
		removeAll(h, name)
	}
	creds := aws.Credentials{AccessKeyID: r.Keys.AccessKeyID, SecretAccessKey: r.Keys.SecretAccessKey,
		SessionToken: r.Keys.SessionToken, Source: "egressd"}
	return signer.SignHTTP(ctx, creds, r.Out, hash, service, region, r.Now, func(o *v4.SignerOptions) {
		// S3 signs the path as sent; every other service escapes it once more.
		o.DisableURIPathEscaping = service == "s3"
	})
}

// check returns the region and service of the placeholder signature, or the refusal.
func (r Request) check() (region, service string, err error) {
	if presignKey(r.Out) != "" {
		if presignKey(r.Out) == r.Placeholder {
			return "", "", r.refuse(DetailPresigned)
		}
		return "", "", r.refuse(DetailKey)
	}
	auth := r.Out.Header.Values("Authorization")
	if len(auth) != 1 {
		return "", "", r.refuse(DetailUnsigned)
	}
	sc, ok := parseAuthorization(auth[0])
	switch {
	case !ok:
		return "", "", r.refuse(DetailUnsigned)
	case r.Placeholder == "" || sc.keyID != r.Placeholder:
		return "", "", r.refuse(DetailKey)
	case r.Scope == nil:
		return "", "", r.refuse(DetailNoScope)
	case !r.Scope.AllowsRegion(sc.region):
		return "", "", r.refuse(DetailRegion)
	case !r.Scope.AllowsService(sc.service):
		return "", "", r.refuse(DetailService)
	}
	return sc.region, sc.service, nil
}

func (r Request) refuse(detail string) error {
	return &ScopeError{Credential: r.Credential, Host: r.Host, Detail: detail}
}

// payloadHash returns the payload hash to sign: the SDK's hex hash or unsigned-payload
// value, kept as sent; else the hash of a small body, read whole (and put back).
func (r Request) payloadHash() (string, error) {
	vs := r.Out.Header.Values(headerContentSHA)
	if len(vs) > 1 {
		return "", r.refuse(DetailPayload)
	}
	if len(vs) == 1 {
		switch v := vs[0]; {
		case v == unsignedPayload || v == streamingUnsignedTrailer || isHexHash(v):
			return v, nil
		case strings.HasPrefix(v, streamingSignedPrefix):
			return "", r.refuse(DetailChunkSigned)
		}
		return "", r.refuse(DetailPayload)
	}
	return r.hashBody()
}

// hashBody reads a body of at most MaxHashedBody bytes, hashes it and puts it back.
func (r Request) hashBody() (string, error) {
	out := r.Out
	if out.Body == nil || out.Body == http.NoBody || out.ContentLength == 0 {
		sum := sha256.Sum256(nil)
		return hex.EncodeToString(sum[:]), nil
	}
	if out.ContentLength < 0 || out.ContentLength > MaxHashedBody {
		return "", r.refuse(DetailPayload)
	}
	if r.Hold != nil {
		if err := r.Hold(out.ContentLength); err != nil {
			return "", err
		}
	}
	data, err := io.ReadAll(io.LimitReader(out.Body, MaxHashedBody+1))
	if err != nil {
		return "", err
	}
	if int64(len(data)) != out.ContentLength {
		return "", r.refuse(DetailPayload)
	}
	out.Body = io.NopCloser(bytes.NewReader(data))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

func isHexHash(v string) bool {
	if len(v) != 64 {
		return false
	}
	_, err := hex.DecodeString(v)
	return err == nil
}

// presignKey returns the access key ID of a presigned URL's X-Amz-Credential, any case.
func presignKey(out *http.Request) string {
	for k, vs := range out.URL.Query() {
		if strings.EqualFold(k, queryCredential) && len(vs) > 0 {
			key, _, _ := strings.Cut(vs[0], "/")
			return key
		}
	}
	return ""
}

// scope is the credential scope of a SigV4 Authorization header.
type scope struct {
	keyID, region, service string
}

// parseAuthorization reads "AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request,
// SignedHeaders=..., Signature=...".
func parseAuthorization(v string) (scope, bool) {
	alg, rest, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || alg != algorithm {
		return scope{}, false
	}
	for _, part := range strings.Split(rest, ",") {
		cred, ok := strings.CutPrefix(strings.TrimSpace(part), "Credential=")
		if !ok {
			continue
		}
		f := strings.Split(cred, "/")
		if len(f) != 5 || f[0] == "" || f[2] == "" || f[3] == "" || f[4] != "aws4_request" {
			return scope{}, false
		}
		return scope{keyID: f[0], region: f[2], service: f[3]}, true
	}
	return scope{}, false
}

// removeAll deletes every field named name from h, whatever its case.
func removeAll(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}
