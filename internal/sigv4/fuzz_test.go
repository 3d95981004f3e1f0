package sigv4

import (
	"strings"
	"testing"
)

// FuzzParseAuthorization: whatever the sandbox sends as Authorization, parsing never
// panics, and a scope it accepts names a key, a region and a service without the
// separators a credential scope cannot hold.
func FuzzParseAuthorization(f *testing.F) {
	f.Add("AWS4-HMAC-SHA256 Credential=AKIAX/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
	f.Add("AWS4-HMAC-SHA256 Credential=//us-east-1//aws4_request")
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, v string) {
		sc, ok := parseAuthorization(v)
		if !ok {
			return
		}
		for _, s := range []string{sc.keyID, sc.region, sc.service} {
			if s == "" || strings.ContainsAny(s, "/,") {
				t.Fatalf("%q parsed to %+v", v, sc)
			}
		}
	})
}
