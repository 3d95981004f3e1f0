package aws_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/egressd/egressd/internal/testutil/egressdtest"
	"github.com/egressd/egressd/internal/testutil/netns"
	"github.com/egressd/egressd/internal/testutil/testpki"
	"github.com/egressd/egressd/internal/testutil/vaultdev"
)

// TestVaultSTS: the keys come from the test Vault's AWS secrets engine, which asks
// MinIO's STS (AssumeRole, as MinIO's root user) for assumed-role keys; egressd reads
// the engine and signs with those keys and their session token. MinIO lacks
// GetCallerIdentity, which the engine calls to check its client: a front answers that
// one call (startSTSFront).
func TestVaultSTS(t *testing.T) {
	needClients(t)
	ca := testpki.New(t)
	up := startS3(t, ca)
	v := startVault(t, ca)
	c := vaultClient(t, v)
	configureEngine(t, c, up, startSTSFront(t, ca), v)
	if _, err := c.Logical().Write("secret/data/egressd/credentials/aws-sts", map[string]any{"data": map[string]any{
		"type": "aws", "vault_aws": map[string]any{"role": "sandbox", "kind": "sts"}}}); err != nil {
		t.Fatal(err)
	}
	su := setup{credID: "aws-sts", regions: []string{"us-east-1"}, creds: &egressdtest.Credentials{Backend: "vault",
		Vault: &egressdtest.Vault{Address: v.Addr, Auth: egressdtest.VaultAuth{Method: "token", Token: v.RootToken}}}}
	w := newWorld(t, "explicit", up, su)
	clientCases(t, w, up, "sts-explicit")
	if n, _, _ := w.e.Metric(`egressd_credential_mint_total{credential="aws-sts",result="ok"}`); n < 1 {
		t.Errorf("egressd_credential_mint_total ok = %v, want at least 1", n)
	}
	// What MinIO allows of the engine's other kind: an iam_user role needs IAM's
	// CreateUser, which MinIO does not serve.
	if _, err := c.Logical().Write("aws/roles/iam", map[string]any{"credential_type": "iam_user",
		"policy_arns": []string{"arn:aws:iam::aws:policy/AmazonS3ReadOnlyAccess"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Logical().Read("aws/creds/iam"); err == nil {
		t.Error("aws/creds/iam worked against MinIO: test the creds kind against it too")
	} else {
		t.Logf("aws/creds/iam against MinIO (no IAM API): %v", err)
	}
}

func startVault(t *testing.T, ca *testpki.CA) *vaultdev.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := vaultdev.Build(ctx, "../../scripts/vaultdev.sh")
	if err != nil {
		requireClients(t, "the test Vault: %v", err)
	}
	// The engine's client (aws-sdk-go) verifies MinIO's certificate against the test
	// CA: AWS_CA_BUNDLE, where set, replaces the system roots SSL_CERT_FILE names.
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFile(t, caFile, ca.PEM())
	t.Setenv("SSL_CERT_FILE", caFile)
	t.Setenv("AWS_CA_BUNDLE", caFile)
	v, err := vaultdev.Start(ctx, bin, t.TempDir(), "error")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Stop)
	return v
}

func vaultClient(t *testing.T, v *vaultdev.Server) *api.Client {
	t.Helper()
	c, err := v.Client()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// configureEngine does what a security team does (docs/aws.md): the engine's root keys
// and STS endpoint, and an assumed_role role.
func configureEngine(t *testing.T, c *api.Client, up *s3, sts string, v *vaultdev.Server) {
	t.Helper()
	if err := c.Sys().Mount("aws", &api.MountInput{Type: "aws"}); err != nil {
		t.Fatal(err)
	}
	for path, data := range map[string]map[string]any{
		"aws/config/root": {"access_key": up.accessKey, "secret_key": up.secretKey, "region": "us-east-1",
			"sts_endpoint": sts, "iam_endpoint": "https://" + s3IP, "sts_region": "us-east-1"},
		"aws/roles/sandbox": {"credential_type": "assumed_role", "role_arns": []string{"arn:aws:iam::123456789012:role/sandbox"},
			"default_sts_ttl": "15m"},
	} {
		if _, err := c.Logical().Write(path, data); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	sec, err := c.Logical().Read("aws/sts/sandbox")
	if err != nil || sec == nil {
		t.Fatalf("aws/sts/sandbox (MinIO's AssumeRole): %v\n%s", err, v.Log(3000))
	}
	if k, _ := sec.Data["access_key"].(string); k == "" || k == up.accessKey || sec.LeaseDuration <= 0 {
		t.Fatalf("aws/sts/sandbox gave no temporary keys (lease %ds)", sec.LeaseDuration)
	}
}

// stsIP is where the STS front listens: MinIO's STS serves AssumeRole but not
// GetCallerIdentity, which Vault's engine calls first to check its client.
const stsIP = "93.184.216.35"

// startSTSFront answers GetCallerIdentity for MinIO's root user and passes every
// other STS call (AssumeRole) to MinIO unchanged, Host included, so MinIO verifies
// the engine's signature itself.
func startSTSFront(t *testing.T, ca *testpki.CA) string {
	t.Helper()
	netns.AddLoopbackAddr(t, stsIP+"/32")
	target, _ := url.Parse("https://" + s3IP)
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.Host = r.In.Host },
		Transport: &http.Transport{TLSClientConfig: tlsConfig(ca)},
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if form, _ := url.ParseQuery(string(body)); form.Get("Action") == "GetCallerIdentity" {
			w.Header().Set("Content-Type", "text/xml")
			io.WriteString(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult>`+
				`<Arn>arn:aws:iam::123456789012:root</Arn><UserId>123456789012</UserId><Account>123456789012</Account>`+
				`</GetCallerIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></GetCallerIdentityResponse>`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	ln, err := net.Listen("tcp", stsIP+":443")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, stsIP)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return "https://" + stsIP
}
