package sigv4

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/egressd/egressd/internal/allowlist"
)

const (
	placeholderID = "AKIAPLACEHOLDER23456"
	realID        = "AKIAREALKEY234567ABC"
	realSecret    = "real/secret+key0123456789abcdefghijklmnop"
	realToken     = "real-session-token"
	emptySHA      = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

var allowed = &allowlist.AWSScope{Regions: []string{"us-east-1"}, Services: []string{"s3", "sts"}}

// sandboxRequest is a request as an SDK holding the placeholder pair signs it.
func sandboxRequest(t *testing.T, keyID, region, service, payload string, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, "https://bucket.s3.test/a%20key?x-id=PutObject", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if payload != "" {
		req.Header.Set(headerContentSHA, payload)
	}
	req.Header.Set("X-Amz-Security-Token", "sandbox-token-must-go")
	creds := aws.Credentials{AccessKeyID: keyID, SecretAccessKey: "placeholder-secret"}
	hash := payload
	if hash == "" {
		hash = emptySHA
	}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, hash, service, region, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	return req
}

func request(out *http.Request) Request {
	return Request{Out: out, Credential: "aws-dev", Host: "bucket.s3.test", Scope: allowed, Placeholder: placeholderID,
		Keys: Keys{AccessKeyID: realID, SecretAccessKey: realSecret, SessionToken: realToken}, Now: time.Now()}
}

// verify checks out's signature the way a SigV4 service does: signed again from
// scratch with the real keys at its X-Amz-Date, the Authorization must be the same.
func verify(t *testing.T, out *http.Request, region, service, hash string) {
	t.Helper()
	got := out.Header.Get("Authorization")
	if !strings.Contains(got, "Credential="+realID+"/") || !strings.Contains(got, "/"+region+"/"+service+"/aws4_request") {
		t.Fatalf("Authorization %q: want the real key and allowed %s/%s", got, region, service)
	}
	at, err := time.Parse("20060102T150405Z", out.Header.Get(headerDate))
	if err != nil {
		t.Fatal(err)
	}
	check := out.Clone(context.Background())
	check.Header.Del("Authorization")
	creds := aws.Credentials{AccessKeyID: realID, SecretAccessKey: realSecret, SessionToken: realToken}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, check, hash, service, region, at,
		func(o *v4.SignerOptions) { o.DisableURIPathEscaping = service == "s3" }); err != nil {
		t.Fatal(err)
	}
	if want := check.Header.Get("Authorization"); got != want {
		t.Fatalf("signature does not verify:\n got %s\nwant %s", got, want)
	}
	if tok := out.Header.Values(headerToken); len(tok) != 1 || tok[0] != realToken {
		t.Fatalf("X-Amz-Security-Token %q: want only the real session token", tok)
	}
}

func TestSignKeepsThePayloadHash(t *testing.T) {
	for _, payload := range []string{unsignedPayload, streamingUnsignedTrailer, strings.Repeat("ab", 32)} {
		out := sandboxRequest(t, placeholderID, "us-east-1", "s3", payload, "body")
		if err := Sign(context.Background(), request(out)); err != nil {
			t.Fatalf("%s: %v", payload, err)
		}
		if got := out.Header.Get(headerContentSHA); got != payload {
			t.Fatalf("X-Amz-Content-Sha256 %q, want %q kept", got, payload)
		}
		verify(t, out, "us-east-1", "s3", payload)
		if b, _ := io.ReadAll(out.Body); string(b) != "body" {
			t.Fatalf("body %q", b)
		}
	}
}

func TestSignHashesASmallBodyWithoutHash(t *testing.T) {
	out := sandboxRequest(t, placeholderID, "us-east-1", "sts", "", "Action=GetCallerIdentity")
	if err := Sign(context.Background(), request(out)); err != nil {
		t.Fatal(err)
	}
	verify(t, out, "us-east-1", "sts", hashOf("Action=GetCallerIdentity"))
	if b, _ := io.ReadAll(out.Body); string(b) != "Action=GetCallerIdentity" {
		t.Fatalf("body %q not put back", b)
	}
}

// TestHashedBodyHeld: the body read whole is reserved first, at its declared length,
// and a reservation refused is the answer, with nothing of the body read.
func TestHashedBodyHeld(t *testing.T) {
	const body = "Action=GetCallerIdentity"
	full := errors.New("budget spent")
	var asked int64
	r := request(sandboxRequest(t, placeholderID, "us-east-1", "sts", "", body))
	r.Hold = func(n int64) error { asked = n; return full }
	if err := Sign(context.Background(), r); err != full || asked != int64(len(body)) {
		t.Fatalf("Sign = %v after Hold(%d), want the refusal after Hold(%d)", err, asked, len(body))
	}
	if b, _ := io.ReadAll(r.Out.Body); string(b) != body {
		t.Fatalf("the body was read (%q left) though it could not be held", b)
	}
}

func hashOf(s string) string {
	r := Request{Out: &http.Request{Body: io.NopCloser(strings.NewReader(s)), ContentLength: int64(len(s))}}
	h, _ := r.hashBody()
	return h
}

func TestSignRefuses(t *testing.T) {
	cases := []struct {
		name    string
		req     func() *http.Request
		allowed *allowlist.AWSScope
		detail  string
	}{
		{"real key", func() *http.Request { return sandboxRequest(t, realID, "us-east-1", "s3", unsignedPayload, "") }, allowed, DetailKey},
		{"region", func() *http.Request { return sandboxRequest(t, placeholderID, "eu-west-1", "s3", unsignedPayload, "") }, allowed, DetailRegion},
		{"service", func() *http.Request { return sandboxRequest(t, placeholderID, "us-east-1", "iam", unsignedPayload, "") }, allowed, DetailService},
		{"no allowed", func() *http.Request { return sandboxRequest(t, placeholderID, "us-east-1", "s3", unsignedPayload, "") }, nil, DetailNoScope},
		{"chunk signed", func() *http.Request {
			return sandboxRequest(t, placeholderID, "us-east-1", "s3", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "")
		}, allowed, DetailChunkSigned},
		{"unsigned", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "https://bucket.s3.test/k", nil)
			return r
		}, allowed, DetailUnsigned},
		{"basic auth", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "https://bucket.s3.test/k", nil)
			r.SetBasicAuth("AKIA", "x")
			return r
		}, allowed, DetailUnsigned},
		{"presigned placeholder", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "https://bucket.s3.test/k?X-Amz-Credential="+placeholderID+"%2F20260101%2Fus-east-1%2Fs3%2Faws4_request", nil)
			return r
		}, allowed, DetailPresigned},
		{"presigned other key", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, "https://bucket.s3.test/k?x-amz-credential="+realID+"%2F20260101%2Fus-east-1%2Fs3%2Faws4_request", nil)
			return r
		}, allowed, DetailKey},
		{"large body without hash", func() *http.Request {
			r := sandboxRequest(t, placeholderID, "us-east-1", "sts", "", "")
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(strings.Repeat("x", MaxHashedBody+1))), MaxHashedBody+1
			return r
		}, allowed, DetailPayload},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := c.req()
			before := out.Header.Get("Authorization")
			r := request(out)
			r.Scope = c.allowed
			err := Sign(context.Background(), r)
			var se *ScopeError
			if !errors.As(err, &se) || se.Detail != c.detail {
				t.Fatalf("err %v, want detail %s", err, c.detail)
			}
			if strings.Contains(se.Error(), realSecret) || strings.Contains(se.Error(), realID) {
				t.Fatalf("error shows a key: %v", se)
			}
			if out.Header.Get("Authorization") != before {
				t.Fatal("a refused request was changed")
			}
		})
	}
}
