// Package sockaddr is the one parser of the Unix socket addresses that
// statsd (--listen, --lifecycle-listen), statsagent (--sockets, a glob) and
// statsctl (--socket, --lifecycle-socket, poll --sockets) take on their
// command lines. Each accepts three spellings of the same socket:
//
//	/run/statsd/sbx-1.sock           a path (relative paths are relative to the working directory)
//	unix:/run/statsd/sbx-1.sock      gRPC's unix:PATH (PATH may be relative)
//	unix:///run/statsd/sbx-1.sock    gRPC's unix://ABSOLUTE_PATH, as grpcurl and crictl take it
//
// and rejects every other scheme (tcp:, vsock:, dns:, http://, unix-abstract:,
// ...) with an error that names it: the daemons serve and the clients dial
// Unix sockets only.
//
// A flag takes it as a flag.Value:
//
//	listen := "/run/statsd/statsd.sock"
//	fs.Var(sockaddr.Flag{Path: &listen}, "listen", "Unix socket: a `path`, unix:PATH or unix:///PATH")
//
// It depends on the standard library only, so that every binary may link it.
package sockaddr
