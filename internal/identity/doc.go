// Package identity holds which workloads are bound to this statsd and where
// to measure each (a Binding per actor, up to a ceiling), across Run,
// Restore and Checkpoint and across restarts of the daemon.
//
// Lifecycle calls of one actor are serialized under that actor's lock, and
// the commits of all actors under one more, never held across a source read;
// they are the only writers. Readers load the bindings through an atomic
// pointer and never take a lock, so a poll that lands mid-restore answers at
// once. A Binding is never mutated after it is published: a reader that
// loads an actor's binding twice and gets the same pointer knows the
// identity did not change in between.
//
// The bindings are persisted, all in one file, under a state directory with a crash-safe write
// (temp file, fsync, rename, fsync of the directory). A state file that
// cannot be read is moved aside, never deleted, and the daemon starts with no
// workload.
//
// Each ended activation's record is numbered per statsd instance (an
// instance id and a sequence, persisted with the records, never reused; a
// wiped state is a new instance), and the records dropped are counted, with
// those no reader was served (ledger.go, EndedLog).
package identity
