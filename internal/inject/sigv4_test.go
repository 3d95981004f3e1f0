package inject

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/credential"
	"github.com/egressd/egressd/internal/sigv4"
)

type placeholders map[string]string

func (p placeholders) AWSKeyID(id string) (string, bool) { v, ok := p[id]; return v, ok }

const awsPlaceholder = "AKIAPLACEHOLDERXXXXX"

func awsRule(t *testing.T, keys *credential.AWS) (*Injector, *allowlist.Rule) {
	t.Helper()
	p, err := allowlist.Compile([]allowlist.Entry{{Domain: "s3.example.com", Credential: "aws-dev",
		AWS: &allowlist.AWSScope{Regions: []string{"us-east-1"}, Services: []string{"s3"}}}}, allowlist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return New(p, fakeCreds{"aws-dev": {ID: "aws-dev", Version: "1", Type: credential.TypeAWS, AWS: keys}}), p.Rules()[0]
}

func signedRequest(t *testing.T, keyID string) *http.Request {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://s3.example.com/bucket/key", nil)
	req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	if err := v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: keyID, SecretAccessKey: "x"},
		req, "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	return req
}

// TestAWSApplySignScrub: Apply leaves the placeholder signature for Sign, which signs
// with the real keys; the response is scrubbed of every real key.
func TestAWSApplySignScrub(t *testing.T) {
	keys := &credential.AWS{AccessKeyID: "AKIAREALREALREAL1234", SecretAccessKey: "real-secret-key-0123456789", SessionToken: "real-session-token-abc"}
	in, r := awsRule(t, keys)
	out := signedRequest(t, awsPlaceholder)
	res, err := in.Apply(r, out.Header, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token"}; !slices.Equal(res.Names, want) {
		t.Errorf("injected names %q, want %q", res.Names, want)
	}
	if err := res.Sign(context.Background(), out, "s3.example.com", placeholders{"aws-dev": awsPlaceholder}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.Header.Get("Authorization"), "Credential="+keys.AccessKeyID+"/") ||
		out.Header.Get("X-Amz-Security-Token") != keys.SessionToken {
		t.Fatalf("not signed with the real keys: %v", out.Header)
	}
	for _, v := range keys.Secrets() {
		if _, n := res.Scrub.String("upstream says " + v); n == 0 {
			t.Errorf("a real key is not scrubbed from responses")
		}
	}
}

// TestAWSRefusals: a request not signed with the placeholder is refused, and keys not
// read yet (or expired) make the credential unavailable, never a forwarded request.
func TestAWSRefusals(t *testing.T) {
	in, r := awsRule(t, &credential.AWS{AccessKeyID: "AKIAREAL", SecretAccessKey: "s"})
	out := signedRequest(t, "AKIAREAL")
	res, _ := in.Apply(r, out.Header, nil)
	var se *sigv4.ScopeError
	if err := res.Sign(context.Background(), out, "s3.example.com", placeholders{"aws-dev": awsPlaceholder}, nil); !errors.As(err, &se) || se.Detail != sigv4.DetailKey {
		t.Fatalf("real key from the sandbox: %v, want %s", err, sigv4.DetailKey)
	}
	for name, keys := range map[string]*credential.AWS{
		"not read": {Vault: &credential.VaultAWS{Mount: "aws", Role: "r", Kind: "sts"}},
		"expired":  {AccessKeyID: "AKIA", SecretAccessKey: "s", Expires: time.Now().Add(time.Second)},
	} {
		in, r := awsRule(t, keys)
		_, err := in.Apply(r, signedRequest(t, awsPlaceholder).Header, nil)
		var ue *credential.UnavailableError
		if !errors.As(err, &ue) || ue.Cause != credential.CauseNoAWSKeys {
			t.Errorf("%s: %v, want unavailable %s", name, err, credential.CauseNoAWSKeys)
		}
	}
}
