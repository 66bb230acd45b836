#!/bin/sh
# check-deploy.sh: the checks of deploy/ that make test runs (make deploy-check):
#   promtool check rules / test rules   deploy/prometheus
#   systemd-analyze verify              deploy/systemd, as make install lays them out (must print nothing)
#   go vet, staticcheck, go test        the deploy module: strict Kubernetes manifests, the dashboard
#   otelcol validate                    deploy/otel/collector.yaml, by the test collector (e2e/otelcol,
#                                       built into $BIN/otelcol after its go mod tidy -diff, vet,
#                                       staticcheck and tests, as the otelcol image's binary is:
#                                       make images-check built it just before, so this is a link)
# A missing tool (apt-get install prometheus systemd) skips its check with a
# hint, except under CI=true, where it fails. Run from the repository root
# after make build.
set -eu
GO=${GO:-go}
BIN=${BIN:-$(pwd)/bin}
fail=0

need() { # need TOOL PACKAGE
	command -v "$1" >/dev/null 2>&1 && return 0
	if [ "${CI:-}" = true ]; then
		echo "check-deploy: $1 is missing (apt-get install $2)" >&2; fail=1
	else
		echo "check-deploy: SKIP: $1 is missing (apt-get install $2)" >&2
	fi
	return 1
}

if need promtool prometheus; then
	promtool check rules deploy/prometheus/*.rules.yml
	(cd deploy/prometheus && promtool test rules ./*.test.yml)
fi

if need systemd-analyze systemd; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# Installed under a temporary prefix, so that the units' ExecStart name
	# binaries that exist (verify checks them).
	${MAKE:-make} -s install PREFIX="$tmp" DESTDIR= BIN="$BIN" >/dev/null
	units="$tmp/lib/systemd/system/statsd@.service $tmp/lib/systemd/system/statsagent.service"
	# shellcheck disable=SC2086 # two paths
	out=$(cd "$tmp" && systemd-analyze verify $units 2>&1) || { echo "$out" >&2; echo "check-deploy: systemd-analyze verify failed" >&2; fail=1; }
	if [ -n "$out" ]; then
		echo "$out" >&2; echo "check-deploy: systemd-analyze verify printed the above (want nothing)" >&2; fail=1
	else
		echo "systemd-analyze verify: statsd@.service statsagent.service: clean"
	fi
fi

# The deploy module: its own go.mod (k8s.io/api, prometheus-operator's types,
# kustomize), fetched through the Go module proxy.
(cd deploy && $GO vet ./... && "$BIN/staticcheck" ./... && $GO test -count=1 ./...)

# The node collector's config, validated by the OpenTelemetry Collector's
# own config validation: the test collector (e2e/otelcol, a module of its
# own with the Collector's modules, fetched through the Go module proxy;
# with a cold build cache its vet, staticcheck, tests and build take a few
# minutes) runs `validate` on it with the environment it names, and must
# refuse it without. Its modules out of
# reach (no proxy) skip this, except under CI=true, where it fails.
if (cd e2e/otelcol && $GO mod download) >/dev/null 2>&1; then
	(cd e2e/otelcol && $GO mod tidy -diff && $GO vet ./... && "$BIN/staticcheck" ./... && $GO test -count=1 ./... &&
		CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=readonly $GO build -trimpath -buildvcs=false -o "$BIN/otelcol" .)
	OTEL_GATEWAY_ENDPOINT=gateway.example:4317 "$BIN/otelcol" validate --config deploy/otel/collector.yaml
	if "$BIN/otelcol" validate --config deploy/otel/collector.yaml >/dev/null 2>&1; then
		echo "check-deploy: deploy/otel/collector.yaml validates without OTEL_GATEWAY_ENDPOINT (want an error)" >&2; fail=1
	fi
	echo "otelcol validate: deploy/otel/collector.yaml: valid"
elif [ "${CI:-}" = true ]; then
	echo "check-deploy: the e2e/otelcol modules cannot be downloaded:" >&2
	(cd e2e/otelcol && $GO mod download) >&2 || true
	fail=1
else
	echo "check-deploy: SKIP: otelcol validate: the e2e/otelcol modules cannot be downloaded (go mod download in e2e/otelcol)" >&2
fi

exit $fail
