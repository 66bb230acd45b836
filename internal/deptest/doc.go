// Package deptest holds the dependency test of the binaries under cmd/:
// which packages each one must not link (after tailscale's tstest/deptest).
// statsctl is an API client: it links the API, gRPC and the client side
// (internal/api, internal/rate, internal/sweep) and the dependency-free
// helpers (internal/sockaddr, internal/version), nothing that reads kernel
// files, dials a guest agent or serves metrics; a package of this module
// that statsctl links must be allowed explicitly (statsctlAllowed). statsd serves no metrics.
// No binary links a test-only package. A main package outside cmd/ escapes
// these rules, so it must be a known dev tool, run with go run and never
// installed (devTools: internal/benchtable, for make bench).
//
// The package has no code; the rules are in deptest_test.go and run with
// go test ./... (they need the go tool).
package deptest
