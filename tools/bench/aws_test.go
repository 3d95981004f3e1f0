package main

import (
	"net/http"
	"testing"
)

// The upstream takes a GET only signed with the real keys: one egressd left
// signed with the placeholder pair, or signed wrongly, is a 403, a client error.
func TestAWSVerified(t *testing.T) {
	url := "https://" + awsHost + ":8443" + awsPath
	for _, c := range []struct {
		name, key, secret string
		want              bool
	}{{"real keys", awsKeyID, awsSecret, true}, {"placeholder pair", "AKIAPLACEHOLDER00000", awsSecret, false},
		{"wrong secret", awsKeyID, "not-the-secret", false}} {
		r, _ := http.NewRequest(http.MethodGet, url, nil)
		r.Header = awsSigned(url, c.key, c.secret)
		r.Host = awsHost + ":8443"
		r.Header.Set("Accept-Encoding", "identity") // unsigned, added after: ignored
		if got := awsVerified(r); got != c.want {
			t.Errorf("%s: verified %v, want %v", c.name, got, c.want)
		}
	}
}
