// Package peercred reads the credentials of the process at the other end of
// a Unix socket connection (SO_PEERCRED on Linux): for a client, those of
// the server that called listen(2); for a server, those of the client that
// called connect(2).
//
// The node agent checks with PeerUID that the daemon it dialed runs as an
// allowed user before it reads an answer. It depends on nothing of the
// daemon, so a client can use it.
package peercred
