package clients_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// envRequire turns a missing client program from a skip into a failure; make test
// sets it, after scripts/install-test-deps.sh and scripts/install-client-deps.sh
// installed them.
const envRequire = "EGRESSD_REQUIRE_CLIENTS"

// python is Debian's interpreter, which sees Debian's python3-requests,
// python3-httpx and python3-h2 (a pyenv or venv python3 earlier on PATH does not).
const python = "/usr/bin/python3"

// undiciVersion is the undici scripts/install-client-deps.sh installs (it reads
// this line): the 7.x line, the last that runs on Node 20.
const undiciVersion = "7.30.2"

// envNodeModules names the node_modules holding undici; default: the
// repository's .cache/node/node_modules, where scripts/install-client-deps.sh
// puts it.
const envNodeModules = "EGRESSD_CLIENTS_NODE_MODULES"

func nodeModules() string {
	if d := os.Getenv(envNodeModules); d != "" {
		return d
	}
	abs, _ := filepath.Abs("../../.cache/node/node_modules")
	return abs
}

// script is the path of a client script in testdata/.
func script(name string) string {
	abs, _ := filepath.Abs(filepath.Join("testdata", name))
	return abs
}

var (
	toolMu      sync.Mutex
	toolMissing = map[string]string{} // tool -> why it is missing ("" present)
)

// need skips the test (fails it under envRequire) unless tool is usable: curl,
// git, npm, node (with undici), python (with requests, httpx, h2 and aiohttp),
// pip, grpcclient.
func need(t *testing.T, tool string) {
	t.Helper()
	toolMu.Lock()
	why, known := toolMissing[tool]
	if !known {
		why = probeTool(tool)
		toolMissing[tool] = why
	}
	toolMu.Unlock()
	if why == "" {
		return
	}
	if os.Getenv(envRequire) != "" {
		t.Fatalf("%s is set but %s", envRequire, why)
	}
	t.Skip(why)
}

func probeTool(tool string) string {
	switch tool {
	case "python":
		if err := exec.Command(python, "-c", "import requests, httpx, h2, aiohttp").Run(); err != nil {
			return python + " lacks requests, httpx, h2 or aiohttp (scripts/install-test-deps.sh installs them)"
		}
	case "pip":
		if err := exec.Command(python, "-m", "pip", "--version").Run(); err != nil {
			return python + " -m pip does not run (scripts/install-test-deps.sh installs python3-pip)"
		}
	case "node":
		if _, err := exec.LookPath("node"); err != nil {
			return "node is not installed"
		}
		var pkg struct{ Version string }
		b, err := os.ReadFile(filepath.Join(nodeModules(), "undici", "package.json"))
		if err != nil || json.Unmarshal(b, &pkg) != nil || pkg.Version != undiciVersion {
			return "undici " + undiciVersion + " is not in " + nodeModules() + " (scripts/install-client-deps.sh installs it)"
		}
	case "grpcclient":
		if os.Getenv(envGRPCClient) == "" {
			return "the grpc-go client was not built"
		}
	default:
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not installed (scripts/install-test-deps.sh installs it)"
		}
	}
	return ""
}
