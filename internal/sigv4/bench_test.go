package sigv4

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSign is the CPU egressd adds per request to an aws entry: parse the
// placeholder signature, check it, sign again (an S3 GET with UNSIGNED-PAYLOAD and
// a session token). Compare BenchmarkApply in internal/inject (a static header).
func BenchmarkSign(b *testing.B) {
	t := &testing.T{}
	base := sandboxRequest(t, placeholderID, "us-east-1", "s3", unsignedPayload, "")
	b.ReportAllocs()
	for b.Loop() {
		out := base.Clone(context.Background())
		out.Header = base.Header.Clone()
		if err := Sign(context.Background(), Request{Out: out, Credential: "aws-dev", Host: "bucket.s3.test", Scope: allowed,
			Placeholder: placeholderID, Keys: Keys{AccessKeyID: realID, SecretAccessKey: realSecret, SessionToken: realToken},
			Now: time.Now()}); err != nil {
			b.Fatal(err)
		}
	}
}
