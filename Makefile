# shardsrv — `make run` serves an example checkpoint, `make test` runs the whole suite.
SHELL := /bin/bash
GO ?= go
BIN := bin/shardsrv
ADDR ?= localhost:8080
FUZZTIME ?= 10s

.PHONY: all build run test unit fuzz lint generate bench clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/shardsrv

## run: generate the example checkpoint into .run/ and serve it on $(ADDR)
run: build
	@$(BIN) example --out .run/checkpoints --addr $(ADDR)
	@echo
	@echo "Serving on http://$(ADDR) (Ctrl-C to stop)"
	@$(BIN) serve --store .run/checkpoints --addr $(ADDR)

## test: everything CI runs
test: lint unit fuzz

unit:
	$(GO) test -race -count=1 ./...

## fuzz: run each fuzz target briefly ($(FUZZTIME)) on top of its seed corpus
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/safetensors
	$(GO) test -run '^$$' -fuzz '^FuzzPlan$$' -fuzztime $(FUZZTIME) ./internal/planner

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run 'gofmt -w .'"; exit 1; }
	$(GO) vet ./...

## generate: regenerate api/api.gen.go from openapi.yaml (oapi-codegen, pinned in go.mod as a tool)
generate:
	cd api && $(GO) generate ./...

## bench: measure against baselines in one run and write docs/benchmarks.md
bench:
	$(GO) run ./cmd/shardsrv-bench -out docs/benchmarks.md

clean:
	rm -rf bin .run
