// Package identity holds which workload is bound to this statsd and where to
// measure it (a Binding), across Run, Restore and Checkpoint and across
// restarts of the daemon.
//
// Lifecycle calls are serialized under one lock and are the only writers;
// readers load the current Binding through an atomic pointer and never take
// the lock, so a poll that lands mid-restore answers at once. A Binding is
// never mutated after it is published: a reader that loads it twice and gets
// the same pointer knows the identity did not change in between.
//
// The binding is persisted under a state directory with a crash-safe write
// (temp file, fsync, rename, fsync of the directory). A state file that
// cannot be read is moved aside, never deleted, and the daemon starts with no
// workload.
package identity
