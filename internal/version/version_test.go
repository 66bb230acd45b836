package version_test

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/version"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want version.Info
	}{
		{
			name: "make build in a git clone with local changes",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sandboxstats/sandboxstats", Version: "v0.0.0-20261201091900-2ae3b55abcde+dirty"},
				Settings: []debug.BuildSetting{
					{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}, {Key: "vcs", Value: "git"},
					{Key: "vcs.revision", Value: "2ae3b55abcde0123456789abcdef0123456789ab"},
					{Key: "vcs.time", Value: "2026-12-01T09:19:00Z"}, {Key: "vcs.modified", Value: "true"},
				}},
			want: version.Info{Module: "github.com/sandboxstats/sandboxstats", Version: "v0.0.0-20261201091900-2ae3b55abcde+dirty",
				Revision: "2ae3b55abcde0123456789abcdef0123456789ab", Time: time.Date(2026, 12, 1, 9, 19, 0, 0, time.UTC), Modified: true,
				Go: "go1.26.8", Platform: "linux/amd64"},
		},
		{
			name: "built without VCS stamping",
			bi:   debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sandboxstats/sandboxstats", Version: "(devel)"}},
			want: version.Info{Module: "github.com/sandboxstats/sandboxstats", Version: "(devel)", Go: "go1.26.8", Platform: runtime.GOOS + "/" + runtime.GOARCH},
		},
		{
			name: "go install of a tag, cross-compiled",
			bi: debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sandboxstats/sandboxstats", Version: "v1.2.0"},
				Settings: []debug.BuildSetting{{Key: "GOOS", Value: "darwin"}, {Key: "GOARCH", Value: "arm64"}}},
			want: version.Info{Module: "github.com/sandboxstats/sandboxstats", Version: "v1.2.0", Go: "go1.26.8", Platform: "darwin/arm64"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, version.FromBuildInfo(&tc.bi)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestText(t *testing.T) {
	i := version.Info{Module: "github.com/sandboxstats/sandboxstats", Version: "v0.0.0-20261201091900-2ae3b55abcde",
		Revision: "2ae3b55abcde0123456789abcdef0123456789ab", Time: time.Date(2026, 12, 1, 9, 19, 0, 0, time.UTC),
		Go: "go1.26.8", Platform: "linux/amd64"}
	want := `statsd v0.0.0-20261201091900-2ae3b55abcde
module:   github.com/sandboxstats/sandboxstats
revision: 2ae3b55abcde0123456789abcdef0123456789ab
time:     2026-12-01T09:19:00Z
modified: false
go:       go1.26.8 linux/amd64
`
	if diff := cmp.Diff(want, i.Text("statsd")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	bare := version.Info{Go: "go1.26.8", Platform: "linux/amd64"}.Text("statsagent")
	if !strings.HasPrefix(bare, "statsagent unknown\nmodule:   unknown\nrevision: unknown (built without VCS stamping") {
		t.Errorf("no build info:\n%s", bare)
	}
}

// TestGet: a test binary carries build information (no VCS stamp): the
// module and the running Go.
func TestGet(t *testing.T) {
	i := version.Get()
	if i.Go != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Get() = %+v; want Go %s on %s/%s", i, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
}
