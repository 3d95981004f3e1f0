package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The manifests are validated offline against the Kubernetes API's own schemas.
// kubeconform cannot fetch its schema repository here, so the schemas are made
// from what the Go module proxy serves, which scripts/install-deploy-deps.sh
// puts in the module cache (the pins below, read by that script):
// api/openapi-spec/swagger.json of the Kubernetes module, and the
// Prometheus Operator's CRDs for PodMonitor and PrometheusRule.
const (
	kubernetesModule       = "k8s.io/kubernetes@v1.37.2"
	prometheusOperatorMod  = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	kubeconformVersion     = "v0.7.0"
	helmVersion            = "v4.3.2"
	requireDeployToolsEnv  = "EGRESSD_REQUIRE_DEPLOY_TOOLS"
	keepSchemasEnv         = "EGRESSD_KUBECONFORM_SCHEMAS"
	kubeconformSchemaNames = "{{ .ResourceKind }}{{ .KindSuffix }}.json"
)

// schemaKinds are the kinds the manifests use, by the name kubeconform looks
// them up under (kind + "-" + group's first label + "-" + version).
var schemaKinds = map[string]string{
	"io.k8s.api.apps.v1.Deployment":            "deployment-apps-v1",
	"io.k8s.api.apps.v1.DaemonSet":             "daemonset-apps-v1",
	"io.k8s.api.core.v1.Pod":                   "pod-v1",
	"io.k8s.api.core.v1.ConfigMap":             "configmap-v1",
	"io.k8s.api.core.v1.Secret":                "secret-v1",
	"io.k8s.api.core.v1.ServiceAccount":        "serviceaccount-v1",
	"io.k8s.api.networking.v1.NetworkPolicy":   "networkpolicy-networking-v1",
	"io.k8s.api.policy.v1.PodDisruptionBudget": "poddisruptionbudget-policy-v1",
}

var crdKinds = map[string]string{
	"monitoring.coreos.com_podmonitors.yaml":     "podmonitor-monitoring-v1",
	"monitoring.coreos.com_prometheusrules.yaml": "prometheusrule-monitoring-v1",
}

// deployTool finds a tool make deps installed in .cache/bin (or on PATH); without
// it the test skips, or fails under EGRESSD_REQUIRE_DEPLOY_TOOLS.
func deployTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := filepath.Abs(filepath.Join("..", ".cache", "bin", name)); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	missing(t, name+" is not installed (make deps: scripts/install-deploy-deps.sh)")
	return ""
}

func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(requireDeployToolsEnv) != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// moduleDir is where the module cache holds mod, which make deps downloaded;
// it never downloads (GOPROXY=off).
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		missing(t, fmt.Sprintf("%s is not in the module cache (make deps): %v %s", mod, err, info.Error))
	}
	return info.Dir
}

// kubeconformSchemas writes the schemas of schemaKinds and crdKinds into a
// directory, strict (an unknown field is an error, as kubectl's server-side
// field validation makes it), and returns it. With EGRESSD_KUBECONFORM_SCHEMAS
// set the directory is that one and stays, for kubeconform run by hand
// (make validate-manifests).
func kubeconformSchemas(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(keepSchemasEnv)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var swagger struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	b, err := os.ReadFile(filepath.Join(moduleDir(t, kubernetesModule), "api", "openapi-spec", "swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &swagger); err != nil {
		t.Fatal(err)
	}
	defs := map[string]any{}
	for name, d := range swagger.Definitions {
		defs[name] = jsonSchema(d)
	}
	for def, file := range schemaKinds {
		if file == "" {
			continue
		}
		root, ok := defs[def].(map[string]any)
		if !ok {
			t.Fatalf("swagger.json has no %s", def)
		}
		schema := map[string]any{"definitions": defs}
		for k, v := range root {
			schema[k] = v
		}
		writeJSON(t, filepath.Join(dir, file+".json"), schema)
	}
	crdDir := filepath.Join(moduleDir(t, prometheusOperatorMod), "example", "prometheus-operator-crd")
	for name, file := range crdKinds {
		writeJSON(t, filepath.Join(dir, file+".json"), crdSchema(t, filepath.Join(crdDir, name)))
	}
	return dir
}

// jsonSchema turns an OpenAPI v2 definition into JSON Schema: every object with
// properties closed to others, and the two string-or-number types accepting both.
func jsonSchema(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = jsonSchema(e)
		}
		if ref, ok := out["$ref"].(string); ok {
			return map[string]any{"$ref": ref}
		}
		if f, _ := out["format"].(string); f == "int-or-string" || f == "quantity" {
			return map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}, map[string]any{"type": "number"}}}
		}
		if _, ok := out["properties"]; ok {
			if _, set := out["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonSchema(e)
		}
		return out
	}
	return v
}

// crdSchema is the v1 openAPIV3Schema of a CRD file, made strict the same way.
func crdSchema(t *testing.T, file string) any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `yaml:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
				} `yaml:"schema"`
			} `yaml:"versions"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1" {
			return jsonSchema(v.Schema.OpenAPIV3Schema)
		}
	}
	t.Fatalf("%s has no v1 schema", file)
	return nil
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// kubeconform validates the manifests in files (or stdin) strictly against the
// schemas; a kind it has no schema for is an error, not a skip.
func kubeconform(t *testing.T, schemas string, stdin []byte, files ...string) {
	t.Helper()
	args := append([]string{"-strict", "-summary", "-output", "text",
		"-schema-location", filepath.Join(schemas, kubeconformSchemaNames)}, files...)
	cmd := exec.Command(deployTool(t, "kubeconform"), args...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("kubeconform %s: %v\n%s", strings.Join(files, " "), err, out)
		return
	}
	t.Logf("kubeconform: %s", strings.TrimSpace(string(out)))
}

// TestKubeconform validates every shipped Kubernetes manifest
// (observability/egressd-alerts.yaml is a Prometheus rule file, not one).
func TestKubeconform(t *testing.T) {
	deployTool(t, "kubeconform")
	files, _ := filepath.Glob("kubernetes/*.yaml")
	kubeconform(t, kubeconformSchemas(t), nil, append(files, nodeManifest)...)
}
