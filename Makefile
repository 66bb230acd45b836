# sandboxstats: build, install, test, lint, regenerate protos, benchmark.
GO       ?= go
BIN      := $(CURDIR)/bin
# make install: PREFIX (default /usr/local) and DESTDIR (a staging root).
PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DATADIR     ?= $(PREFIX)/share
BINARIES    := statsd statsagent statsctl statsnri
TOOLS    := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck
PROTO_GO := $(shell find proto internal -name '*.pb.go' 2>/dev/null)

.PHONY: all build install uninstall test test-unit lint deploy-check images images-check proto proto-check fuzz bench demo tools clean

all: build

# -buildvcs=auto: stamp the VCS revision (statsd --version) in a git clone
# even where GOFLAGS says -buildvcs=false.
build:
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/...

# The binaries, the systemd units (their ExecStart pointed at BINDIR), the
# sandboxstats group for systemd-sysusers, and statsctl's shell completions.
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(DATADIR)/bash-completion/completions $(DESTDIR)$(DATADIR)/zsh/site-functions $(DESTDIR)$(DATADIR)/fish/vendor_completions.d
	install -m 0755 $(addprefix $(BIN)/,$(BINARIES)) $(DESTDIR)$(BINDIR)/
	for u in deploy/systemd/*.service; do \
		sed 's|/usr/local/bin/|$(BINDIR)/|g' "$$u" >$(DESTDIR)$(UNITDIR)/$$(basename "$$u") && chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename "$$u") || exit 1; \
	done
	install -m 0644 deploy/systemd/sandboxstats.sysusers.conf $(DESTDIR)$(SYSUSERSDIR)/sandboxstats.conf
	$(BIN)/statsctl completion bash >$(DESTDIR)$(DATADIR)/bash-completion/completions/statsctl
	$(BIN)/statsctl completion zsh >$(DESTDIR)$(DATADIR)/zsh/site-functions/_statsctl
	$(BIN)/statsctl completion fish >$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/statsctl.fish

uninstall:
	rm -f $(addprefix $(DESTDIR)$(BINDIR)/,$(BINARIES)) $(DESTDIR)$(UNITDIR)/statsd@.service $(DESTDIR)$(UNITDIR)/statsagent.service \
		$(DESTDIR)$(SYSUSERSDIR)/sandboxstats.conf $(DESTDIR)$(DATADIR)/bash-completion/completions/statsctl \
		$(DESTDIR)$(DATADIR)/zsh/site-functions/_statsctl $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/statsctl.fish

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

# The images (internal/ociimage, no Docker): bin/images/<name>.tar, OCI
# image layouts of statsd (with statsctl), statsagent, statsnri and the
# e2e/otelcol Collector, built static and reproducibly; their digests go into
# deploy/kubernetes/kustomization.yaml. images-check (in deploy-check) fails
# when the committed digests are not what this tree builds.
images:
	$(GO) run ./internal/cmd/mkimages -out $(BIN)/images

images-check:
	$(GO) run ./internal/cmd/mkimages -out $(BIN)/images -check

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

# deploy/: promtool check and test rules, systemd-analyze verify of the
# units as installed, the deploy module's strict manifest and dashboard
# tests, the e2e/otelcol module's checks and `otelcol validate` of
# deploy/otel/collector.yaml (scripts/check-deploy.sh).
deploy-check: build $(BIN)/staticcheck images-check
	GO=$(GO) BIN=$(BIN) MAKE=$(MAKE) ./scripts/check-deploy.sh

# The whole suite: unit, contract and end-to-end tests (end-to-end tests need
# root, runsc, qemu and prometheus; with CI=true a missing prerequisite fails
# them), the deploy/ checks, and every fuzz target for a short budget.
# The VM lane (e2e/vmlane: a cgroup v2 kernel under QEMU TCG) runs last and
# alone: its guest's two vCPUs are the machine's two cores. First the
# containerd harness's binaries (containerd, runc, crictl from the module
# proxy; cached under /tmp by version) are built with their own time limit:
# cold, on a loaded 2-core machine, that took 6-7.5 minutes.
test: lint proto-check deploy-check fuzz
	$(GO) test -count=1 -timeout 20m -run '^TestIntegrationBuildContainerd$$' ./internal/testenv
	$(GO) test -count=1 -timeout 10m $$($(GO) list ./... | grep -v -e '/e2e$$' -e '/e2e/vmlane$$')
	$(GO) test -count=1 -timeout 18m ./e2e
	$(GO) test -count=1 -timeout 12m -v ./e2e/vmlane

# Every Fuzz* target of every package, one at a time, FUZZTIME each (the
# seeds also run as unit tests under go test). The list comes from
# `go test -list`: a new target is fuzzed without touching this file. A
# target that fails with only "context deadline exceeded" and no failing
# input is Go 1.26's fuzz coordinator racing its own -fuzztime deadline on a
# loaded machine (golang/go#75804): it is run once more; anything else, or
# that twice, fails.
FUZZTIME ?= 3s
fuzz:
	@targets=$$($(GO) test -list '^Fuzz' ./... | awk '/^Fuzz/ {f[n++]=$$1; next} /^ok/ {for (i = 0; i < n; i++) print $$2 " " f[i]; n = 0}'); \
	test -n "$$targets" || { echo "no fuzz targets found" >&2; exit 1; }; \
	echo "$$targets" | while read -r pkg target; do \
		echo "fuzz $$pkg $$target ($(FUZZTIME))"; \
		for try in 1 2; do \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) "$$pkg" >/tmp/sandboxstats-fuzz.log 2>&1 && break; \
			if [ $$try = 1 ] && grep -q 'context deadline exceeded' /tmp/sandboxstats-fuzz.log && ! grep -q 'Failing input written' /tmp/sandboxstats-fuzz.log; then \
				echo "  the fuzz coordinator's -fuzztime race (golang/go#75804, fixed in Go 1.27), no failing input: once more"; continue; \
			fi; \
			cat /tmp/sandboxstats-fuzz.log; exit 1; \
		done || exit 1; \
	done

test-unit:
	$(GO) test -short ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 -timeout 20m ./... | $(GO) run ./internal/benchtable

clean:
	rm -rf $(BIN)

demo: build
	./scripts/demo.sh
