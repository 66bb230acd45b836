// Package version is the one place the binaries read what they were built
// from: statsd --version, statsagent --version and statsctl version print
// Get().Text(program). Everything comes from the build information the Go
// toolchain embeds (runtime/debug.ReadBuildInfo): the main module's path and
// version, the VCS revision, commit time and dirty flag (stamped by go build
// when it runs in a git checkout with -buildvcs=auto or true; make build
// passes -buildvcs=auto), and the Go version. Nothing is injected with
// -ldflags, so a `go install` build says the same as a `make build` one.
//
// It depends on the standard library only, so that every binary may link it.
package version
