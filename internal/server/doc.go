// Package server implements statsd's gRPC services: the read-only
// WorkloadStatsService and the launcher's WorkloadLifecycleService. It
// validates requests, checks every sample against the bound identity, and
// turns source and identity errors into status codes with a
// google.rpc.ErrorInfo reason. It reads no kernel file and speaks no ttrpc
// itself: measurement is behind source.Source.
package server
