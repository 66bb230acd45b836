// Package connlimit caps the connections a server holds open at once: a
// net.Listener whose Accept closes a connection over the cap at once (its
// peer reads EOF, not a hang) and counts it, so that a flood of
// connections costs the server a bounded number of descriptors,
// goroutines and buffers. cmd/statsagent wraps its metrics listener in one.
//
//	ln = connlimit.NewListener(ln, 64, logger, "metrics connection refused: --metrics-max-connections are open")
//	defer ln.Close()
//	srv.Serve(ln)
package connlimit
