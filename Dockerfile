# syntax=docker/dockerfile:1.7
# The project's images for those who build with Docker (or buildah, kaniko):
#   docker build --target statsd     -t <registry>/sandboxstats/statsd .
#   docker build --target statsagent -t <registry>/sandboxstats/statsagent .
#   docker build --target statsnri   -t <registry>/sandboxstats/statsnri .
#   docker build --target otelcol    -t <registry>/sandboxstats/otelcol .
# The same binaries and base as `make images` (internal/ociimage), which
# needs no Docker and is what the kustomization's digests name: an image
# built here has other digests (its layers' tar metadata differ), so set the
# kustomization to it (kustomize edit set image statsd=<registry>/...:<tag>).

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Static (no cgo), no build path nor VCS stamp in the binaries: as
# internal/ociimage.GoBuild builds them.
ENV CGO_ENABLED=0 GOFLAGS=-mod=readonly GOWORK=off
COPY go.mod go.sum ./
COPY e2e/otelcol/go.mod e2e/otelcol/go.sum e2e/otelcol/
RUN go mod download && cd e2e/otelcol && go mod download
COPY . .
RUN go build -trimpath -buildvcs=false -o /out/ ./cmd/statsd ./cmd/statsctl ./cmd/statsagent ./cmd/statsnri
RUN cd e2e/otelcol && go build -trimpath -buildvcs=false -o /out/otelcol .
# The base's root: what internal/ociimage.BaseLayer holds (its test checks
# that the passwd and group below are the same).
RUN mkdir -p /rootfs/etc /rootfs/home/nonroot /rootfs/root /rootfs/tmp \
	&& chmod 0700 /rootfs/root /rootfs/home/nonroot && chown 65532:65532 /rootfs/home/nonroot \
	&& chmod 1777 /rootfs/tmp
COPY <<EOT /rootfs/etc/passwd
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOT
COPY <<EOT /rootfs/etc/group
root:x:0:
sandboxstats:x:2375:
nonroot:x:65532:
EOT
COPY <<EOT /rootfs/etc/nsswitch.conf
hosts: files dns
EOT

FROM scratch AS base
COPY --from=build /rootfs/ /
# COPY makes what it copies root's unless told: the nonroot user's home is
# its own (the modes, /tmp's sticky bit included, are kept).
COPY --from=build --chown=65532:65532 /rootfs/home/nonroot /home/nonroot
ENV PATH=/usr/local/bin
WORKDIR /
ARG REVISION=""
ARG VERSION=""
LABEL org.opencontainers.image.source="https://github.com/sandboxstats/sandboxstats" \
	org.opencontainers.image.revision="${REVISION}" \
	org.opencontainers.image.version="${VERSION}"

# statsd runs as root: it reads other users' /proc/<pid> (the sentries', the
# VMMs') and the host's cgroup files; statsctl beside it for kubectl exec.
FROM base AS statsd
COPY --from=build /out/statsd /out/statsctl /usr/local/bin/
USER 0:0
ENTRYPOINT ["/usr/local/bin/statsd"]

# statsnri dials containerd's NRI socket (root's, mode 0600): root.
FROM base AS statsnri
COPY --from=build /out/statsnri /usr/local/bin/
USER 0:0
ENTRYPOINT ["/usr/local/bin/statsnri"]

FROM base AS otelcol
COPY --from=build /out/otelcol /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/otelcol"]

# The last stage is the default target: statsagent, unprivileged.
FROM base AS statsagent
COPY --from=build /out/statsagent /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/statsagent"]
