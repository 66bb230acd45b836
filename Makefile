# sandboxstats: build, test, lint, regenerate protos, benchmark.
GO       ?= go
BIN      := $(CURDIR)/bin
TOOLS    := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck
PROTO_GO := $(shell find proto internal -name '*.pb.go' 2>/dev/null)

.PHONY: all build test test-unit lint proto proto-check bench demo tools clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# Code generators, pinned in tools/go.mod so `make proto` is byte-for-byte
# reproducible.
tools: $(TOOLS)
$(TOOLS): tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf \
		google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		honnef.co/go/tools/cmd/staticcheck

proto: $(TOOLS)
	rm -f $(PROTO_GO)
	$(BIN)/buf generate

# Fails when the committed generated code differs from what `make proto` makes.
proto-check: proto
	@git diff --exit-code -- proto internal || { echo "generated code is stale: run make proto and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- proto internal | grep '\.pb\.go$$')" || { echo "untracked generated code: commit it" >&2; exit 1; }

# vet and staticcheck on Linux, build and vet for darwin too (the packages
# that need Linux have *_others.go stubs), the dependency test (what each
# binary may link), gofmt, buf lint.
lint: $(TOOLS)
	$(GO) vet ./...
	GOOS=darwin $(GO) build ./...
	GOOS=darwin $(GO) vet ./...
	$(BIN)/staticcheck ./...
	$(GO) test -count=1 ./internal/deptest
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); test -z "$$out" || { echo "gofmt needed: $$out" >&2; exit 1; }
	$(BIN)/buf lint

# The whole suite: unit, contract and end-to-end tests (end-to-end tests need
# root, runsc and qemu; with CI=true a missing prerequisite fails them).
test: lint proto-check
	$(GO) test -count=1 -timeout 15m ./...

test-unit:
	$(GO) test -short ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 20m ./... | $(GO) run ./internal/benchtable

clean:
	rm -rf $(BIN)

demo: build
	./scripts/demo.sh
