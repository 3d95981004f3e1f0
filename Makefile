# egressd — make run (quick start), make test (everything CI runs), make bench.
GO          ?= go
CACHE       := $(CURDIR)/.cache
BIN         := $(CURDIR)/bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
STATICCHECK := $(CACHE)/bin/staticcheck
STATICCHECK_VERSION := v0.8.2

.PHONY: all build run test deps lint unit fuzz bench bench-idle bench-node soak clean validate-manifests

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/egressd ./cmd/egressd

## run: egressd on the quick-start config (file-backed credentials, no Vault).
run: build
	chmod 600 configs/credentials.json  # a checkout leaves it readable by every user
	$(BIN)/egressd run --config configs/quickstart.yaml

## test: install what the tests need, lint, then every test under -race.
test: deps lint unit

# deps installs what the tests need on a fresh machine (iproute2, util-linux,
# iptables; the real-client suite's curl, git and Python libraries from Debian,
# its pinned undici from npm into $(CACHE)/node; boto3 and the AWS CLI; helm,
# kubeconform, the schemas' modules and docker-compose for deploy/) and builds
# the Vault dev server, HashiCorp's vault CLI (test/vaultdoc runs docs/vault.md
# with it) and MinIO (test/aws's S3) once (cached outside the clone).
deps:
	@scripts/install-test-deps.sh
	@scripts/install-netns-deps.sh
	@scripts/install-client-deps.sh $(CACHE)
	@scripts/install-deploy-deps.sh
	@scripts/vaultdev.sh build >/dev/null
	@scripts/install-vault-cli.sh >/dev/null
	@scripts/minio.sh build >/dev/null

## validate-manifests: kubeconform, offline, on MANIFESTS (default: the plain
## sidecar manifest), then on the chart rendered with its defaults, against the schemas
## deploy/kubeconform_test.go makes, kept in $(CACHE)/kubeconform-schemas. Needs
## scripts/install-deploy-deps.sh once (make deps does it).
SCHEMAS   := $(CACHE)/kubeconform-schemas
MANIFESTS ?= deploy/kubernetes/egressd-sidecar.yaml
validate-manifests:
	EGRESSD_KUBECONFORM_SCHEMAS=$(SCHEMAS) EGRESSD_REQUIRE_DEPLOY_TOOLS=1 \
	  $(GO) test -count=1 -run '^TestKubeconform$$' ./deploy/ >/dev/null
	$(CACHE)/bin/kubeconform -strict -summary -schema-location '$(SCHEMAS)/{{ .ResourceKind }}{{ .KindSuffix }}.json' $(MANIFESTS)
	$(CACHE)/bin/helm template egressd deploy/helm/egressd | $(CACHE)/bin/kubeconform -strict -summary \
	  -schema-location '$(SCHEMAS)/{{ .ResourceKind }}{{ .KindSuffix }}.json' -

lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

$(STATICCHECK):
	GOBIN=$(CACHE)/bin GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# EGRESSD_REQUIRE_NETNS makes tests that must run in a loopback-only network
# namespace fail, rather than skip, when one cannot be made; EGRESSD_REQUIRE_CGROUP
# likewise those that run egressd in a memory cgroup they make (as root);
# EGRESSD_REQUIRE_VAULT makes the Vault integration tests fail rather than skip
# without a server, which scripts/with-vault.sh starts for the run and stops after it,
# and EGRESSD_REQUIRE_VAULT_CLI test/vaultdoc without the vault CLI deps built;
# EGRESSD_REQUIRE_CLIENTS makes the real-client suite (test/clients) fail rather than
# skip a client that deps did not install (PyGithub in cmd/egressd too);
# EGRESSD_REQUIRE_DEPLOY_TOOLS likewise the deploy/ tests that need helm,
# kubeconform, the schemas or docker-compose.
unit:
	scripts/with-vault.sh env EGRESSD_REQUIRE_NETNS=1 EGRESSD_REQUIRE_CGROUP=1 EGRESSD_REQUIRE_VAULT=1 EGRESSD_REQUIRE_VAULT_CLI=1 \
	  EGRESSD_REQUIRE_CLIENTS=1 EGRESSD_CLIENTS_NODE_MODULES=$(CACHE)/node/node_modules EGRESSD_REQUIRE_DEPLOY_TOOLS=1 \
	  $(GO) test -race -count=1 -timeout 15m ./...

## fuzz: each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

## bench: throughput and latency through egressd, and through its peers goproxy and
## smokescreen (the bench builds them with scripts/peers.sh, cached after the first time),
## as ratios to a direct connection, and the node rows (-paths node: bench-node alone);
## then scrubbing's CPU share per 1 KiB request.
bench: build
	$(GO) run ./tools/bench -egressd $(BIN)/egressd
	@echo "scrubbing's share of egressd's CPU per 1 KiB request, with 0 and 100 environment_variable credentials loaded:"
	$(GO) test -run '^$$' -bench 'BenchmarkScrubRequest1KiB' -benchtime 3000x -count 3 ./internal/proxy/

## bench-node: the node rows alone (a node egressd with 1 and with 1,000 sandboxes:
## memory, the API's p99, latency under churn, CPU per request; about a minute).
bench-node: build
	$(GO) run ./tools/bench -egressd $(BIN)/egressd -paths node

## bench-idle: egressd's memory with IDLE_TUNNELS (default 10000) idle CONNECT tunnels
## open (test/conformance's TestIdleTunnelsMemory on bin/egressd, in a loopback-only
## namespace; about a minute; not in make bench). It raises the fd limit first, which
## takes root; without it the test says what it needs.
IDLE_TUNNELS ?= 10000
bench-idle: build
	ulimit -n $$((2 * $(IDLE_TUNNELS) + 4096)) 2>/dev/null || echo "bench-idle: the fd limit stays $$(ulimit -n): raising it takes root"; \
	  EGRESSD_IDLE_TUNNELS=$(IDLE_TUNNELS) EGRESSD_CONFORMANCE_BIN=$(BIN)/egressd \
	  $(GO) test -count=1 -v -run '^TestIdleTunnelsMemory$$' -timeout 10m ./test/conformance/

## soak: SOAK_DURATION (default 10m) of mixed traffic, reloads and credential rotations
## through bin/egressd, in a loopback-only network namespace; fails on goroutine, fd or
## RSS growth and on any request served with the wrong policy (test/soak/README.md).
## Not part of make test. Quick run: make soak SOAK_DURATION=1m
SOAK_DURATION ?= 10m
SOAK_CLIENTS  ?= 16
SOAK_RATE     ?= 200
soak: build
	EGRESSD_SOAK=1 EGRESSD_SOAK_BIN=$(BIN)/egressd EGRESSD_SOAK_DURATION=$(SOAK_DURATION) \
	  EGRESSD_SOAK_CLIENTS=$(SOAK_CLIENTS) EGRESSD_SOAK_RATE=$(SOAK_RATE) EGRESSD_REQUIRE_NETNS=1 \
	  $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 3h ./test/soak/

clean:
	rm -rf $(BIN) $(CACHE)
