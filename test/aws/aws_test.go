package aws_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/testpki"
)

// boto3Result is what testdata/s3client.py prints.
type boto3Result struct {
	Got     map[string]bool `json:"got"`
	Sent    []string        `json:"sent"` // X-Amz-Content-SHA256 of each request, as boto3 signed it
	Status  int             `json:"status"`
	Partial int             `json:"partial"` // 206 answers the client received
	Reason  string          `json:"reason"`
}

func needClients(t *testing.T) {
	t.Helper()
	for _, p := range []string{python, awsCLI} {
		if _, err := os.Stat(p); err != nil {
			requireClients(t, "%s missing (scripts/install-client-deps.sh installs python3-boto3 and awscli)", p)
		}
	}
}

// TestStaticKeys: the real keys are MinIO's root keys, static in the file backend.
func TestStaticKeys(t *testing.T) {
	needClients(t)
	ca := testpki.New(t)
	up := startS3(t, ca)
	creds, _ := json.Marshal(map[string]any{"aws-dev": map[string]string{"type": "aws",
		"access_key_id": up.accessKey, "secret_access_key": up.secretKey}})
	su := setup{creds: &egressdtest.Credentials{Backend: "file", File: "credentials.json"},
		files: map[string]string{"credentials.json": string(creds)}, credID: "aws-dev", regions: []string{"us-east-1"}}
	for _, mode := range []string{"explicit", "transparent"} {
		t.Run(mode, func(t *testing.T) {
			w := newWorld(t, mode, up, su)
			clientCases(t, w, up, "static-"+mode)
		})
	}
}

// clientCases runs boto3 and the AWS CLI through w: uploads of every payload kind
// and downloads succeed (MinIO verified each signature under the real keys), a wrong
// region or service is refused, and no real key reaches a client or the log.
func clientCases(t *testing.T, w *world, up *s3, bucket string) {
	t.Helper()
	var r boto3Result
	out := w.run(t, python, "testdata/s3client.py", "https://"+s3Host, bucket, "put")
	decode(t, out, &r)
	for _, k := range []string{"single", "trailer", "multi"} {
		if !r.Got[k] {
			t.Fatalf("boto3 %s: object not read back intact: %s", k, out)
		}
	}
	if !contains(r.Sent, "STREAMING-UNSIGNED-PAYLOAD-TRAILER") || !contains(r.Sent, "UNSIGNED-PAYLOAD") {
		t.Errorf("boto3 sent payload hashes %v: want STREAMING-UNSIGNED-PAYLOAD-TRAILER and UNSIGNED-PAYLOAD among them", r.Sent)
	}
	var rr boto3Result
	decode(t, w.run(t, python, "testdata/s3client.py", "https://"+s3Host, bucket, "ranged"), &rr)
	if !rr.Got["ranged"] || rr.Partial < 3 {
		t.Errorf("boto3 download_file of 20 MiB in 8 MiB parts: intact %v, %d partial answers; want intact from 3 ranged GETs", rr.Got["ranged"], rr.Partial)
	}
	for c, want := range map[string]string{"wrong_region": "credential_scope", "wrong_service": "credential_scope"} {
		var rr boto3Result
		decode(t, w.run(t, python, "testdata/s3client.py", "https://"+s3Host, bucket, c), &rr)
		if rr.Status != 403 || rr.Reason != want {
			t.Errorf("boto3 %s: status %d reason %q, want 403 %s", c, rr.Status, rr.Reason, want)
		}
	}
	src := w.dir + "/cli-upload.txt"
	writeFile(t, src, []byte("uploaded by the aws cli\n"))
	w.run(t, awsCLI, "s3", "cp", src, "s3://"+bucket+"/cli", "--endpoint-url", "https://"+s3Host, "--region", "us-east-1")
	if got := w.run(t, awsCLI, "s3", "cp", "s3://"+bucket+"/cli", "-", "--endpoint-url", "https://"+s3Host, "--region", "us-east-1"); got != "uploaded by the aws cli\n" {
		t.Errorf("aws s3 cp back: %q", got)
	}
	checkNoLeak(t, w, up, out)
}

// checkNoLeak fails when a real key appears in a client's output or egressd's log.
func checkNoLeak(t *testing.T, w *world, up *s3, outputs ...string) {
	t.Helper()
	log := string(w.e.LogBytes())
	for _, secret := range []string{up.secretKey, up.accessKey} {
		if strings.Contains(log, secret) {
			t.Errorf("a real key is in egressd's log")
		}
		for _, o := range outputs {
			if strings.Contains(o, secret) {
				t.Errorf("a real key reached the client")
			}
		}
	}
}

func decode(t *testing.T, out string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
