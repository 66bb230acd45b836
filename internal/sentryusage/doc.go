// Package sentryusage reads per-container CPU, memory and pids of a gVisor
// sandbox from its sentry's control server, in the process, without running
// `runsc events --stats` per container per read. It is a client of one
// method only: every request it can send is containerManager.Event (Method,
// a constant), which reads and changes nothing; the same server also execs,
// checkpoints and destroys, and checks no peer credentials, so no other
// method is ever composed here and no file descriptor is ever sent.
//
// The wire is gVisor's urpc (pkg/urpc, pkg/unet): a Unix stream socket, one
// JSON request {"method":...,"arg":...}, one JSON reply
// {"success":bool,"err":string,"result":EventOut}, no length prefix. A call
// dials, writes the request, reads one JSON value of at most
// Config.MaxReplyBytes under a deadline (Config.Timeout, or the context's if
// sooner) and decodes it in the same pass into only the fields used
// (decodeReply; parseReply is the same on bytes), and closes. Text from the
// sentry (its error message, container ids it names) is cut and escaped
// with internal/foreign before it is carried.
//
// A Session (Client.Session) keeps its connection between Reads, as urpc
// allows (its server serves calls on a connection in a loop), for at most
// Config.KeepFor (2 s) after the dial: a Read on it costs no socket, connect,
// accept or close. Any error closes it, and so do bytes the sentry sends
// while no call is in flight (checked before each request); the next Read
// dials. A kept connection is one file descriptor here and one goroutine in
// the sentry; statsd holds one per bound gVisor workload with --runsc-root
// (at most --max-workloads, 64). KeepFor bounds the one cost a sandbox sees:
// a sentry whose root container exits waits for its control clients before
// it exits (runsc's --control-rpc-stop-timeout, 15 s; observed 15.0 s with a
// connection kept, 2.0 s with KeepFor 2 s).
//
// The control socket has two layouts, tried in this order:
//
//	<root>/runsc-<sandbox id>.sock  a file in runsc's --root: from release-20230130 (gVisor cf52b8a4)
//	@runsc-sandbox.<sandbox id>     abstract: up to release-20230123, a last fallback until release-20230920 (36b9b19d)
//
// The roots are Config.RootDirs (under containerd's runsc shim
// /run/containerd/runsc/k8s.io); the abstract name is tried only when
// Config.Abstract is set, with the trailing NUL every such runsc binds
// (golang.org/x/sys before v0.14.0 counted it), then without.
//
// What the fields mean, and on which runsc, is in Usage's documentation;
// in short: CPU is nanoseconds of the sentry's
// own per-container accounting, every container of the sandbox in one reply,
// not rescaled to the host cgroup (runsc events rescales; ScaleToHost does
// the same); memory is the sandbox's total on runsc before release-20230731
// and an even split or the container's own after, which Usage.Memory says.
//
//	c, err := sentryusage.New(sentryusage.Config{
//		RootDirs: []string{"/run/containerd/runsc/k8s.io"},
//		Abstract: true,
//		Timeout:  time.Second,
//	})
//	if err != nil { ... }
//	u, err := c.Read(ctx, sentryusage.Query{SandboxID: sid, ContainerID: cid})
//
//	s := c.Session() // one sandbox read again and again
//	defer s.Close()
//	u, err = s.Read(ctx, sentryusage.Query{SandboxID: sid, ContainerID: cid})
package sentryusage
