package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Info is what a binary was built from. Empty strings and a zero Time mean
// not recorded.
type Info struct {
	Module   string    `json:"module"`             // main module path
	Version  string    `json:"version"`            // its version: a tag, a pseudo-version or "(devel)"
	Revision string    `json:"revision,omitempty"` // VCS commit
	Time     time.Time `json:"time,omitzero"`      // commit time, UTC
	Modified bool      `json:"modified"`           // the work tree had uncommitted changes
	Go       string    `json:"go"`                 // toolchain version, e.g. go1.26.8
	Platform string    `json:"platform"`           // GOOS/GOARCH
}

// Get returns the running binary's Info (only Go and Platform when the
// binary carries no build information).
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts Info from build information.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	i := Info{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	goos, goarch := runtime.GOOS, runtime.GOARCH
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				i.Time = t.UTC()
			}
		case "vcs.modified":
			i.Modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	if i.Go == "" {
		i.Go = runtime.Version()
	}
	i.Platform = goos + "/" + goarch
	return i
}

// Text renders i for program's --version: one "key: value" line each.
func (i Info) Text(program string) string {
	var b strings.Builder
	row := func(k, v string) { fmt.Fprintf(&b, "%-9s %s\n", k+":", v) }
	fmt.Fprintf(&b, "%s %s\n", program, orUnknown(i.Version))
	row("module", orUnknown(i.Module))
	if i.Revision == "" {
		row("revision", "unknown (built without VCS stamping: -buildvcs=false, a git worktree, or outside a git checkout)")
	} else {
		row("revision", i.Revision)
		if !i.Time.IsZero() {
			row("time", i.Time.Format(time.RFC3339))
		}
		row("modified", fmt.Sprint(i.Modified))
	}
	row("go", i.Go+" "+i.Platform)
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
