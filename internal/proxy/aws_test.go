package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/egressd/egressd/internal/allowlist"
	"github.com/egressd/egressd/internal/config"
)

// The real keys of awsRangeWorld's credential.
const (
	awsRealKeyID  = "AKIAREALKEYFORRANGE1"
	awsRealSecret = "real/secret/key/for/the/range/test/0123456"
)

// awsRangeWorld has s3.allowed.test sign with an aws credential, and an upstream that
// serves ranges of a body quoting the access key ID it was signed with. With
// envVar, the policy also has an environment_variable credential. headers.allowed.test
// signs with it too, and sets a header of its own.
func awsRangeWorld(t *testing.T, envVar bool, limits func(*config.Limits)) *world {
	t.Helper()
	env := map[string]string{"AWS_ACCESS_KEY_ID": "aws-dev", "AWS_SECRET_ACCESS_KEY": "aws-dev"}
	creds := map[string]string{"aws-dev": `{"type": "aws", "access_key_id": "` + awsRealKeyID +
		`", "secret_access_key": "` + awsRealSecret + `"}`}
	if envVar {
		env["OTHER_TOKEN"] = "other"
		creds["other"] = `{"type": "environment_variable", "value": "other-secret-value-0123456789", "injection_location": "header", "trusted_domains": ["api.allowed.test"]}`
	}
	scope := &allowlist.AWSScope{Regions: []string{"us-east-1"}, Services: []string{"s3"}}
	w := newWorld(t, worldOpts{envVars: env, credentials: creds, limits: limits, allowlist: []allowlist.Entry{
		{Domain: "s3.allowed.test", Credential: "aws-dev", AWS: scope},
		{Domain: "headers.allowed.test", Credential: "aws-dev", AWS: scope, Transform: []allowlist.Header{{Name: "X-Static", Value: staticValue}}},
	}})
	w.DNS.Set("s3.allowed.test", "A "+w.PublicIP)
	w.DNS.Set("headers.allowed.test", "A "+w.PublicIP)
	w.Upstream.set(func(rw http.ResponseWriter, r *http.Request) {
		_, cred, _ := strings.Cut(r.Header.Get("Authorization"), "Credential=")
		keyID, _, _ := strings.Cut(cred, "/")
		rw.Header().Set("X-Seen-Range", r.Header.Get("Range"))
		http.ServeContent(rw, r, "o.txt", time.Time{}, strings.NewReader("0123456789 "+keyID+" tail"))
	})
	if envVar && !w.waitCredential("other", func(_ string, err error) bool { return err == nil }) {
		t.Fatal("the environment_variable credential was never read")
	}
	return w
}

// placeholderSigned is the header of a request signed with the world's placeholder key
// (egressd checks the key, not the placeholder signature, and signs again).
func (w *world) placeholderSigned(extra http.Header) http.Header {
	h := http.Header{
		"Authorization": {"AWS4-HMAC-SHA256 Credential=" + w.Env["AWS_ACCESS_KEY_ID"] +
			"/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"},
		"X-Amz-Content-Sha256": {"UNSIGNED-PAYLOAD"},
	}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

// TestScrubRangeAWS: an exchange masked of an aws credential's keys alone keeps the
// client's Range, and the part is still masked; with any environment_variable
// credential in the policy (a value the sandbox can make egressd place, which an
// upstream could store where the object store serves it), or a header the entry sets
// beside the signature, Range goes as for any scrubbed exchange (TestScrubRange).
func TestScrubRangeAWS(t *testing.T) {
	whole := "0123456789 " + awsRealKeyID + " tail"
	ranged := http.Header{"Range": {"bytes=5-35"}}
	for _, proto := range protos {
		w := awsRangeWorld(t, false, nil)
		got := w.fetch(t, proto, "s3.allowed.test", "/bucket/o", w.placeholderSigned(ranged))
		want := strings.ReplaceAll(whole, awsRealKeyID, stars(len(awsRealKeyID)))[5:36]
		if got.resp.StatusCode != http.StatusPartialContent || string(got.body) != want ||
			got.resp.Header.Get("X-Seen-Range") != "bytes=5-35" {
			t.Errorf("%s, aws keys alone: %s %q, the upstream saw Range %q; want 206 %q and the range passed",
				proto, got.resp.Status, got.body, got.resp.Header.Get("X-Seen-Range"), want)
		}
		wholeCase := func(w *world, host, what string) {
			got := w.fetch(t, proto, host, "/bucket/o", w.placeholderSigned(ranged))
			want := strings.ReplaceAll(whole, awsRealKeyID, stars(len(awsRealKeyID)))
			if got.resp.StatusCode != http.StatusOK || string(got.body) != want || got.resp.Header.Get("X-Seen-Range") != "" {
				t.Errorf("%s, %s: %s %q, the upstream saw Range %q; want 200, the whole body masked, no Range",
					proto, what, got.resp.Status, got.body, got.resp.Header.Get("X-Seen-Range"))
			}
		}
		wholeCase(w, "headers.allowed.test", "a header beside the signature")
		wholeCase(awsRangeWorld(t, true, nil), "s3.allowed.test", "with an environment_variable credential")
	}
}

// TestHashedBodiesDrawOnTheBudget: a request without X-Amz-Content-Sha256 has its
// body (up to 1 MiB) read whole to hash it, into a buffer of its declared length;
// requests that declare most of a megabyte and send one byte hold those buffers,
// which draw on the memory budget: once it is spent, the newest is refused 503
// overloaded (detail memory_aws_bodies), and the buffers return when their
// requests end.
func TestHashedBodiesDrawOnTheBudget(t *testing.T) {
	w := awsRangeWorld(t, false, withBudget(8<<20))
	auth := w.placeholderSigned(nil).Get("Authorization") // and no X-Amz-Content-Sha256
	holdBodiesUntilRefused(t, w, "aws_bodies", func(i int) (net.Conn, *bufio.Reader) {
		tc, br := w.interceptedH1(t, "s3.allowed.test")
		fmt.Fprintf(tc, "POST /bucket/%d HTTP/1.1\r\nHost: s3.allowed.test\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\nx", i, auth, heldBody)
		return tc, br
	})
}
