package sweep

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	"github.com/sandboxstats/sandboxstats/internal/statsdfake"
	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// TestDiscoverRefuses: what a glob matches is polled only if it is a socket
// itself (a symlink is not followed: it could point anywhere, such as
// another user's daemon), owned by an allowed uid (by default root and this
// process's uid), and seen once (a hard link to a socket already found is
// the same daemon).
func TestDiscoverRefuses(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to give a socket another owner (run the tests as root)")
	dir := t.TempDir()
	other := t.TempDir()
	statsdfake.Start(t, filepath.Join(dir, "a-real.sock"))
	elsewhere := statsdfake.Start(t, filepath.Join(other, "x.sock"))
	if err := os.Symlink(elsewhere.Socket, filepath.Join(dir, "b-symlink.sock")); err != nil {
		t.Fatal(err)
	}
	foreign := statsdfake.Start(t, filepath.Join(dir, "c-foreign.sock"))
	if err := os.Chown(foreign.Socket, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a-real.sock"), filepath.Join(dir, "d-hardlink.sock")); err != nil {
		t.Fatal(err)
	}
	got, err := Discover(filepath.Join(dir, "*.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{filepath.Join(dir, "a-real.sock")}, got); diff != "" {
		t.Errorf("Discover (-want +got):\n%s", diff)
	}
}

// TestPollCaps: a daemon answering 20,000 samples, one answering a sample
// and 20,000 drift findings, one answering 20,000 ended activations: each
// over-long part is dropped whole (never the first N of it: which N would
// be the hostile daemon's choice) and the poll says so.
func TestPollCaps(t *testing.T) {
	dir := t.TempDir()
	many := statsdfake.Start(t, filepath.Join(dir, "a-samples.sock"))
	var samples []*sandboxstatsv1.WorkloadStatsSample
	for i := range 20_000 {
		samples = append(samples, sample(fmt.Sprintf("a%05d", i), 1, 1))
	}
	many.Set(samples...)
	findings := statsdfake.Start(t, filepath.Join(dir, "b-findings.sock"))
	s := sample("real", 1, 1)
	s.OpenDriftFindings = 1
	findings.Set(s)
	var fs []*sandboxstatsv1.DriftFinding
	for i := range 20_000 {
		fs = append(fs, &sandboxstatsv1.DriftFinding{Kind: sandboxstatsv1.DriftKind_DRIFT_KIND_SANDBOX_DEAD, ActorUid: fmt.Sprintf("f%05d", i)})
	}
	findings.SetDrift(fs...)
	ended := statsdfake.Start(t, filepath.Join(dir, "c-ended.sock"))
	var es []*sandboxstatsv1.EndedActivation
	for i := range 20_000 {
		es = append(es, &sandboxstatsv1.EndedActivation{Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: fmt.Sprintf("e%05d", i)}})
	}
	ended.SetResponse(&sandboxstatsv1.StatsActiveWorkloadsResponse{Samples: []*sandboxstatsv1.WorkloadStatsSample{sample("real2", 1, 1)}, Ended: es})

	results := PollAll(context.Background(), []string{many.Socket, findings.Socket, ended.Socket}, 3, 10*time.Second)
	if r := results[0]; r.Status != StatusError || r.Code != codes.ResourceExhausted || len(r.Samples) != 0 {
		t.Errorf("20,000 samples: status %s code %s, %d samples kept; want an error, ResourceExhausted, none kept", r.Status, r.Code, len(r.Samples))
	}
	if r := results[1]; r.Status != StatusOK || len(r.Samples) != 1 || len(r.DriftFindings) != 0 || r.DriftErr == nil {
		t.Errorf("20,000 findings: status %s, %d samples, %d findings kept (err %v); want the sample, no finding, an error", r.Status, len(r.Samples), len(r.DriftFindings), r.DriftErr)
	}
	if r := results[2]; r.Status != StatusOK || len(r.Samples) != 1 || len(r.Ended) != 0 || r.EndedErr == nil {
		t.Errorf("20,000 ended: status %s, %d samples, %d ended kept (err %v); want the sample, no record, an error", r.Status, len(r.Samples), len(r.Ended), r.EndedErr)
	}
}
