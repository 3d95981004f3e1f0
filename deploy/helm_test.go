package deploy_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const chart = "helm/egressd"

// helmTemplate renders the chart with the values files given (none: its
// defaults), as `helm template` does for an install.
func helmTemplate(t *testing.T, values ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", "sandbox", chart, "--namespace", "agents"}
	for _, v := range values {
		args = append(args, "--values", v)
	}
	cmd := exec.Command(deployTool(t, "helm"), args...)
	cmd.Env = append(cmd.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return out, &renderError{string(ee.Stderr)}
	}
	return out, err
}

type renderError struct{ msg string }

func (e *renderError) Error() string { return e.msg }

// TestHelmChart renders the chart with its defaults and with each values file
// of testdata/helm (the other credential backends and auth methods, Istio, the
// Prometheus Operator's kinds), runs the pod checks of the plain manifest on
// each rendering and validates it with kubeconform.
func TestHelmChart(t *testing.T) {
	deployTool(t, "helm")
	deployTool(t, "kubeconform")
	schemas := kubeconformSchemas(t)
	sets, _ := filepath.Glob("testdata/helm/*.yaml")
	sets = append([]string{""}, sets...)
	for _, values := range sets {
		if strings.HasPrefix(filepath.Base(values), "bad-") {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(values), ".yaml")
		if values == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			var files []string
			if values != "" {
				files = append(files, values)
			}
			out, err := helmTemplate(t, files...)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			checkWorkload(t, loadWorkload(t, "helm template "+name, out))
			kubeconform(t, schemas, out)
		})
	}
}

// TestHelmChartRefuses: the chart will not render a pod that breaks its
// promises: a port or uid of Istio's, a container without requests, a
// container running as Istio's uid.
func TestHelmChartRefuses(t *testing.T) {
	deployTool(t, "helm")
	for values, want := range map[string]string{
		"testdata/helm/bad-istio-port.yaml":      "ports.health 15020 is in Istio's reserved 15000-15090",
		"testdata/helm/bad-istio-uid.yaml":       "uid 1337 is Istio's istio-proxy uid",
		"testdata/helm/bad-no-requests.yaml":     "container agent: resources.requests needs cpu and memory",
		"testdata/helm/bad-agent-istio-uid.yaml": "container agent: runAsUser must be set and be neither 0",
	} {
		t.Run(filepath.Base(values), func(t *testing.T) {
			_, err := helmTemplate(t, values)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("helm template --values %s: %v, want an error containing %q", values, err, want)
			}
		})
	}
}
