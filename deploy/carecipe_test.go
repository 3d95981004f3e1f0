package deploy_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCARecipe runs docs/kubernetes.md's CA recipe as written, but for its kubectl
// line (no cluster here), with the egressd built from this tree first on PATH: it
// must leave a CA certificate and its key in the files that kubectl line makes
// the egressd-ca Secret from, the key readable by its owner only.
func TestCARecipe(t *testing.T) {
	doc := readRepoFile(t, "../docs/kubernetes.md")
	var block string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(doc, -1) {
		if strings.Contains(m[1], "egressd ca init") {
			block = m[1]
		}
	}
	if block == "" {
		t.Fatal("docs/kubernetes.md has no sh block running egressd ca init")
	}
	var script []string
	var kubectl string
	for _, line := range strings.Split(block, "\n") {
		if strings.HasPrefix(line, "kubectl ") {
			kubectl = line
			continue
		}
		script = append(script, line)
	}
	m := regexp.MustCompile(`create secret tls egressd-ca --cert=(\S+) --key=(\S+)`).FindStringSubmatch(kubectl)
	if m == nil {
		t.Fatalf("the recipe's kubectl line %q does not create the tls Secret egressd-ca from two files", kubectl)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "egressd"), "../cmd/egressd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(script, "\n")+"\npwd > "+filepath.Join(dir, "cwd"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the CA recipe failed: %v\n%s", err, out)
	}
	cwd := strings.TrimSpace(readRepoFile(t, filepath.Join(dir, "cwd")))
	cert := pemBlock(t, filepath.Join(cwd, m[1]))
	c, err := x509.ParseCertificate(cert.Bytes)
	if err != nil || !c.IsCA {
		t.Errorf("%s: not a CA certificate (%v)", m[1], err)
	}
	if key := pemBlock(t, filepath.Join(cwd, m[2])); !strings.Contains(key.Type, "PRIVATE KEY") {
		t.Errorf("%s: %s, want a private key", m[2], key.Type)
	}
	if fi, err := os.Stat(filepath.Join(cwd, m[2])); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("%s: mode %v, want readable by its owner only", m[2], fi.Mode())
	}
}

func pemBlock(t *testing.T, path string) *pem.Block {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := pem.Decode(b)
	if p == nil {
		t.Fatalf("%s: not PEM", path)
	}
	return p
}
