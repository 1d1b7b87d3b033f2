# kvroute — see README.md. `make demo` and `make test` are the set-up.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

GO            ?= go
BIN           := $(CURDIR)/bin
CONTROLLER_GEN_VERSION ?= v0.23.0
KUSTOMIZE_VERSION      ?= v5.7.1
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
KUSTOMIZE      := $(BIN)/kustomize-$(KUSTOMIZE_VERSION)
# Brief fuzzing in `make test`; `make fuzz FUZZTIME=5m` for a longer run.
FUZZTIME      ?= 5s
BENCHTIME     ?= 1s
BENCH_TRACES  := testdata/traces/mooncake/conversation_trace.jsonl testdata/traces/mooncake/synthetic_trace.jsonl \
                 testdata/traces/synthetic/llmd_shared_prefix_150x5_6000_1200_1000.jsonl
# Packages whose tests need cgo (libzmq) are built with it; the manager is built without.
export CGO_ENABLED ?= 1

.PHONY: all
all: build

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC from the Go markers.
	$(CONTROLLER_GEN) rbac:roleName=kvroute-manager-role crd paths="./api/...;./controllers/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@hack/sync-embedded-crd.sh

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt:
	$(GO) fmt ./...

.PHONY: vet
vet:
	$(GO) vet ./...

# golangci-lint from the module proxy, built once into bin/ (its version in the name).
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint (.golangci.yml): import layering (depguard), errcheck, function length.
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-gl $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.tmp-gl/golangci-lint $@ && rm -rf $(BIN)/.tmp-gl

.PHONY: envtest
envtest: ## Build (once) and print the envtest control-plane binaries.
	@hack/envtest-assets.sh

.PHONY: test
test: ## Every test: unit, envtest, e2e over real ZMQ, bundle validation, brief fuzzing.
	@$(MAKE) --no-print-directory lint
	@assets=$$(hack/envtest-assets.sh); \
	KUBEBUILDER_ASSETS="$$assets" $(GO) test -count=1 -timeout 30m ./...
	VLLMSIM_HOLD_HEADERS=1 $(GO) test -count=1 -timeout 10m ./router/proxy ./router/app ./test/e2e/router
	@FUZZTIME=$(FUZZTIME) hack/fuzz.sh

.PHONY: chaos
chaos: ## The fault suite (test/chaos): real kvrouter processes against real ZMQ publishers and rings, faults injected.
	KVROUTE_CHAOS_FULL=1 $(GO) test -count=1 -timeout 30m -v ./test/chaos/

.PHONY: trial
trial: ## The trial's acceptance on every regime: capture under round-robin, kvbench cache vs live runs (sim/replay).
	KVROUTE_TRIAL_LONG=1 $(GO) test -count=1 -timeout 30m -v -run TestTrialAgreesWithLiveRuns ./sim/replay/

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default here 5s; e.g. make fuzz FUZZTIME=5m).
	@FUZZTIME=$(FUZZTIME) hack/fuzz.sh

.PHONY: bench
bench: ## Go benchmarks of the hot paths + `kvbench cache` on the shared traces; writes bench/report/.
	@mkdir -p bench/report
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./router/... | tee bench/report/go-bench.txt
	$(GO) build -tags "$(GOTAGS)" -o $(BIN)/kvbench ./cmd/kvbench
	@for t in $(BENCH_TRACES); do \
		name=$$(basename $$t .jsonl); echo "kvbench cache: $$name"; \
		$(BIN)/kvbench cache --trace $$t --replicas 8 --capacity-blocks 4800 --report bench/report/$$name; \
		$(BIN)/kvbench cache --trace $$t --replicas 8 --capacity-blocks 4800 --json > bench/report/$$name.json; \
	done
	@echo "bench: reports under bench/report/"

##@ Build

# What --version prints and kvroute_build_info exports (internal/version): git describe of the
# checkout, its commit, and the build time.
GIT_VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)
GIT_COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
# grpcnotrace keeps gRPC (linked by the OTLP trace exporter) from pulling in html/template, whose
# reflection turns off the linker's dead-code removal: kvrouter would grow from 46 MB to 74 MB.
GOTAGS        ?= grpcnotrace
LDFLAGS       := -X github.com/kvroute/kvroute/internal/version.version=$(GIT_VERSION) \
                 -X github.com/kvroute/kvroute/internal/version.commit=$(GIT_COMMIT) \
                 -X github.com/kvroute/kvroute/internal/version.date=$(BUILD_DATE)

.PHONY: build
build: ## Binaries into bin/, stamped with git describe (bin/NAME --version).
	@mkdir -p $(BIN)
	if [ -d cmd/manager ]; then CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/manager ./cmd/manager; fi
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/kvroutectl ./cmd/kvroutectl
	@for c in kvrouter vllm-sim kvbench; do \
		if [ -d cmd/$$c ]; then $(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/$$c ./cmd/$$c; fi; done

.PHONY: demo
demo: build ## The main job on an embedded default.
	@hack/demo.sh

##@ Ship

# Image and bundle version; the tag of ghcr.io/kvroute/{manager,kvrouter,vllm-sim}.
VERSION           ?= 0.1.0
IMAGE_REPO        ?= ghcr.io/kvroute
CONTAINER_TOOL    ?= docker
# config/default pulls the CRD and ClusterRole from config/crd/bases and config/rbac by file.
KUSTOMIZE_BUILD   := $(KUSTOMIZE) build --load-restrictor LoadRestrictionsNone

.PHONY: build-installer
build-installer: $(KUSTOMIZE) ## Render config/default into dist/install.yaml (committed; test/ship checks it is current).
	@mkdir -p dist
	$(KUSTOMIZE_BUILD) config/default > dist/install.yaml

.PHONY: bundle
bundle: $(KUSTOMIZE) ## Generate the OLM registry+v1 bundle into bundle/ (kustomize + hack/bundle.sh).
	$(KUSTOMIZE_BUILD) config/manifests > bundle/.rendered.yaml
	VERSION=$(VERSION) hack/bundle.sh bundle/.rendered.yaml; rm -f bundle/.rendered.yaml

STAMP_ARGS        := --build-arg COMMIT=$(GIT_COMMIT) --build-arg BUILD_DATE=$(BUILD_DATE)

.PHONY: docker-build
docker-build: ## Build the manager, kvrouter and vllm-sim images (needs a Docker engine; hack/docker-build-check.sh without one).
	$(CONTAINER_TOOL) build -t $(IMAGE_REPO)/manager:v$(VERSION) --build-arg VERSION=v$(VERSION) $(STAMP_ARGS) -f Dockerfile .
	$(CONTAINER_TOOL) build -t $(IMAGE_REPO)/kvrouter:v$(VERSION) --build-arg VERSION=v$(VERSION) $(STAMP_ARGS) -f Dockerfile.kvrouter .
	$(CONTAINER_TOOL) build -t $(IMAGE_REPO)/vllm-sim:v$(VERSION) --build-arg VERSION=v$(VERSION) $(STAMP_ARGS) -f Dockerfile.vllm-sim .
	$(CONTAINER_TOOL) build -t $(IMAGE_REPO)/kvroute-bundle:v$(VERSION) -f bundle.Dockerfile .

.PHONY: images
images: ## OCI image tarballs of manager, kvrouter, vllm-sim and the bundle into bin/images, without a Docker engine.
	VERSION=v$(VERSION) IMAGE_REPO=$(IMAGE_REPO) hack/images.sh

.PHONY: test-images
test-images: ## Build the images into a temp dir and run each under chroot (root, Debian; 10-20 min cold).
	KVROUTE_IMAGE_TESTS=1 $(GO) test -count=1 -timeout 40m -v ./test/images/

.PHONY: docs
docs: ## Regenerate docs/configuration.md from the CRD; the benchmark tables, README headline and plots (hack/gendocs: the fleet model on the traces, docs/results/*.json).
	$(GO) run ./hack/gen-config-reference.go config/crd/bases/serving.kvroute.io_kvroutedmodels.yaml > docs/configuration.md
	$(GO) run ./hack/gendocs

##@ Tools

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-cg $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/.tmp-cg/controller-gen $@ && rm -rf $(BIN)/.tmp-cg

$(KUSTOMIZE):
	@mkdir -p $(BIN)
	GOBIN=$(BIN)/.tmp-kz $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(BIN)/.tmp-kz/kustomize $@ && rm -rf $(BIN)/.tmp-kz

.PHONY: help
help:
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
