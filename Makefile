# shardsrv — `make run` serves an example checkpoint, `make test` runs the whole suite.
SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools/bin
# Pinned versions of what the tests run besides Go itself.
VERSITYGW_VERSION := v1.8.0
HELM_VERSION := v3.22.0
FAKE_GCS_SERVER_VERSION := v1.56.1
# 3.36 and later need Node 21 or newer; 3.35 runs on the machine's Node 20.
AZURITE_VERSION := 3.35.0
# The version, and the image's tag: the chart's appVersion, so the chart, its README and the image
# agree on one tag.
VERSION := $(shell sed -n 's/^appVersion: "\(.*\)"$$/\1/p' helm/shardsrv/Chart.yaml)
IMAGE ?= shardsrv:$(VERSION)
export PATH := $(TOOLS):$(PATH)
BIN := bin/shardsrv
ADDR ?= localhost:8080
FUZZTIME ?= 10s
# Go minimizes each new interesting input for up to 60 s by default, uncounted: in a brief run
# that is the run (FuzzVerify's kilobyte bundles made 7 executions in 10 s). 100 tries each.
FUZZMINIMIZETIME ?= 100x
FUZZ = $(GO) test -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME)
# Debian's Python, whose python3-torch and python3-numpy the Python suite runs with.
PYTHON ?= /usr/bin/python3

.PHONY: all build run test unit fuzz fuzz-http lint generate bench clean tools image python python-deps

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/shardsrv

## run: write the example checkpoint and requests into the store .run/checkpoints and serve it on $(ADDR)
run: build
	@$(BIN) example --out .run/checkpoints --addr $(ADDR)
	@echo
	@echo "Serving on http://$(ADDR) (Ctrl-C to stop: it drains for 5 s as in a pod, a second Ctrl-C ends that)"
	@$(BIN) serve --store .run/checkpoints --addr $(ADDR)

## tools: install what the tests run (S3, GCS and Azure Blob servers, helm), pinned, into .tools/bin
tools: $(TOOLS)/versitygw $(TOOLS)/helm $(TOOLS)/fake-gcs-server $(TOOLS)/azurite-blob

$(TOOLS)/versitygw:
	GOBIN=$(TOOLS) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

$(TOOLS)/helm:
	GOBIN=$(TOOLS) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(TOOLS)/fake-gcs-server:
	GOBIN=$(TOOLS) $(GO) install github.com/fsouza/fake-gcs-server@$(FAKE_GCS_SERVER_VERSION)

# Azurite is an npm package: installed into .tools/azurite, its blob service linked into .tools/bin.
$(TOOLS)/azurite-blob:
	npm install --prefix $(CURDIR)/.tools/azurite --no-save --no-audit --no-fund azurite@$(AZURITE_VERSION)
	mkdir -p $(TOOLS)
	ln -sf ../azurite/node_modules/.bin/azurite-blob $(TOOLS)/azurite-blob

## test: everything CI runs
test: lint unit fuzz python

## unit: -timeout is a hang guard: the server package's -race run took 10–15 min at load 10–17
## on 2 cores, and has needed up to 40 min under heavier load (CI itself allows 90)
unit: tools
	SHARDSRV_REQUIRE_S3=1 SHARDSRV_REQUIRE_GCS=1 SHARDSRV_REQUIRE_AZURE=1 SHARDSRV_REQUIRE_HELM=1 \
		$(GO) test -race -count=1 -timeout 60m ./...

## python: the Python suite against a live server, twice: with Debian's numpy and torch (installed
## with apt-get when missing; torch 1.13 is the oldest the package supports) and with the standard
## library alone (-S: no site packages), which is all the client itself needs
python: build python-deps
	SHARDSRV_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m unittest discover -s clients/python/tests
	SHARDSRV_BIN=$(CURDIR)/$(BIN) $(PYTHON) -S -m unittest discover -s clients/python/tests

python-deps:
	@$(PYTHON) -c 'import numpy, torch' 2>/dev/null || { \
		test "$$(id -u)" = 0 || { echo "make python needs $(PYTHON) with numpy and torch: apt-get install python3-torch python3-numpy"; exit 1; }; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch python3-numpy; }

## fuzz: run each fuzz target briefly ($(FUZZTIME)) on top of its seed corpus
fuzz:
	$(FUZZ) -fuzz '^FuzzParse$$' ./internal/safetensors
	$(FUZZ) -fuzz '^FuzzPlan$$' ./internal/planner
	$(FUZZ) -fuzz '^FuzzVerify$$' ./internal/oms

## fuzz-http: fuzz whole requests through the HTTP handler (FUZZTIME=5m make fuzz-http). Its inputs
## take up to seconds each, more than a brief run in `make test` allows; there its seed corpus runs
## as an ordinary test of every kind of request.
fuzz-http:
	$(GO) test -run '^$$' -fuzz '^FuzzShardRequest$$' -fuzztime $(FUZZTIME) ./internal/server

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run 'gofmt -w .'"; exit 1; }
	$(GO) vet ./...

## generate: regenerate the wire types (api/api.gen.go) and the server glue (internal/server/gen) from
## openapi.yaml (oapi-codegen, pinned in go.mod as a tool)
generate:
	$(GO) generate ./api ./internal/server/gen

## bench: measure against baselines in one run and write docs/benchmarks.md (needs curl: the client the
## plain handlers are measured with)
bench: tools
	@command -v curl >/dev/null || { echo "make bench needs curl (the client of the plain-handler baselines)"; exit 1; }
	$(GO) run ./cmd/shardsrv-bench -out docs/benchmarks.md

## image: build the container image (needs a Docker engine)
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean:
	rm -rf bin .run .tools
