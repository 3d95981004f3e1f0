package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckAWS: check names what an aws credential needs of the policy, with the fix,
// and never prints a key; explain says what it signs for and sets.
func TestCheckAWS(t *testing.T) {
	const secret = "aws-secret-never-printed-0123456789"
	dir := writeFiles(t, map[string]string{
		"egressd.yaml": minimalConfig,
		"credentials.json": `{"aws-dev": {"type": "aws", "access_key_id": "AKIAREALKEYNEVERSHOWN", "secret_access_key": "` + secret + `"},
			"tok": {"token": "x"}}`,
		"environment.json": `{"network": {"allowlist": [
			{"domain": "s3.us-east-1.amazonaws.com", "credential": "aws-dev"},
			{"domain": "b.example.com", "credential": "aws-dev", "aws": {"regions": ["us-east-1"], "services": ["s3"]}}]},
			"env": {"AWS_ACCESS_KEY_ID": {"credential": "aws-dev"}, "AWS_SECRET_ACCESS_KEY": {"credential": "tok"}}}`,
	})
	cfg := filepath.Join(dir, "egressd.yaml")
	res := egressd(t, "check", "--config", cfg)
	for _, want := range []string{"network.allowlist[0].aws: required for aws credential", "both must name the same aws credential"} {
		if res.code == 0 || !strings.Contains(res.all(), want) {
			t.Errorf("check: %s\nwant a failure naming %q", res, want)
		}
	}
	res = egressd(t, "explain", "--config", cfg, "https://b.example.com/")
	f := explainText(t, res)
	if f["inject"] != "Authorization, X-Amz-Date" || !strings.Contains(f["aws"], "regions us-east-1, services s3") {
		t.Errorf("explain: %s", res)
	}
	if strings.Contains(res.all(), secret) || strings.Contains(res.all(), "AKIAREALKEYNEVERSHOWN") {
		t.Errorf("a key was printed:\n%s", res)
	}
}

// TestCheckAWSMinting: an aws block that lets the sandbox have requests signed for a
// service answering with new keys (sts, iam, "*", ...) is refused with the fix,
// unless it sets allow_minting.
func TestCheckAWSMinting(t *testing.T) {
	for _, tc := range []struct {
		services, extra string
		refused         bool
	}{
		{`["s3", "sts"]`, ``, true},
		{`["*"]`, ``, true},
		{`["iam"]`, ``, true},
		{`["s3", "dynamodb"]`, ``, false},
		{`["sts"]`, `, "allow_minting": true`, false},
	} {
		dir := writeFiles(t, map[string]string{
			"egressd.yaml":     minimalConfig,
			"credentials.json": `{"aws-dev": {"type": "aws", "access_key_id": "AKIAREALKEYNEVERSHOWN", "secret_access_key": "s"}}`,
			"environment.json": `{"network": {"allowlist": [{"domain": "sts.amazonaws.com", "credential": "aws-dev",
				"aws": {"regions": ["us-east-1"], "services": ` + tc.services + tc.extra + `}}]},
				"env": {"AWS_ACCESS_KEY_ID": {"credential": "aws-dev"}, "AWS_SECRET_ACCESS_KEY": {"credential": "aws-dev"}}}`,
		})
		res := egressd(t, "check", "--config", filepath.Join(dir, "egressd.yaml"))
		named := strings.Contains(res.all(), `answers with new keys`) && strings.Contains(res.all(), `"allow_minting": true`)
		if tc.refused != (res.code != 0 && named) {
			t.Errorf("services %s%s: %s\nwant refused=%v, naming allow_minting", tc.services, tc.extra, res, tc.refused)
		}
	}
}
