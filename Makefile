# sandboxstats: build, test, lint, regenerate protos, benchmark.
GO       ?= go
BIN      := $(CURDIR)/bin
TOOLS    := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck
PROTO_GO := $(shell find proto internal -name '*.pb.go' 2>/dev/null)

.PHONY: all build test test-unit lint proto proto-check fuzz bench demo tools clean

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
# root, runsc and qemu; with CI=true a missing prerequisite fails them), and
# every fuzz target for a short budget.
test: lint proto-check fuzz
	$(GO) test -count=1 -timeout 15m ./...

# Every Fuzz* target of every package, one at a time, FUZZTIME each (the
# seeds also run as unit tests under go test). The list comes from
# `go test -list`: a new target is fuzzed without touching this file.
FUZZTIME ?= 3s
fuzz:
	@targets=$$($(GO) test -list '^Fuzz' ./... | awk '/^Fuzz/ {f[n++]=$$1; next} /^ok/ {for (i = 0; i < n; i++) print $$2 " " f[i]; n = 0}'); \
	test -n "$$targets" || { echo "no fuzz targets found" >&2; exit 1; }; \
	echo "$$targets" | while read -r pkg target; do \
		echo "fuzz $$pkg $$target ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg" >/tmp/sandboxstats-fuzz.log 2>&1 || { cat /tmp/sandboxstats-fuzz.log; exit 1; }; \
	done

test-unit:
	$(GO) test -short ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 20m ./... | $(GO) run ./internal/benchtable

clean:
	rm -rf $(BIN)

demo: build
	./scripts/demo.sh
