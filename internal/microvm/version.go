package microvm

import (
	"strconv"
	"strings"
)

// agentVersion is the agent's answer to grpc.Health/Version.
type agentVersion struct {
	Raw                 string // agent_version as sent, e.g. "3.8.1" or "unknown"
	GRPC                string // grpc_version, the agent's API version
	Known               bool   // Raw parsed as a release number
	Major, Minor, Patch int
	// quoted is String's text, made once by parseAgentVersion (every
	// sample names the version).
	quoted string
	// noThrottledTime is whyNoThrottledTime, made once by
	// parseAgentVersion for a version not known to be fixed ("" if fixed).
	noThrottledTime string
}

// cpuNanosFixed is the first agent release that reports a cgroup v2 guest's
// CPU in nanoseconds (kata-containers PR #10279); older agents send
// microseconds there.
var cpuNanosFixed = agentVersion{Known: true, Major: 3, Minor: 9, Patch: 0}

// parseAgentVersion reads agent_version leniently: an optional "v", then
// major.minor[.patch]; anything after the numbers (a pre-release or build
// suffix such as "-rc0" or "+git") is ignored, so "3.9.0-rc0" counts as
// 3.9.0. Text without a leading release number ("unknown", "") is not Known.
func parseAgentVersion(raw, grpcVersion string) agentVersion {
	v := parseRelease(raw, grpcVersion)
	if !v.Known || v.less(throttledTimeFixed) {
		v.noThrottledTime = v.whyNoThrottledTime()
	}
	return v
}

// parseRelease is parseAgentVersion but for noThrottledTime.
func parseRelease(raw, grpcVersion string) agentVersion {
	v := agentVersion{Raw: raw, GRPC: grpcVersion}
	v.quoted = v.String()
	s := strings.TrimPrefix(strings.TrimSpace(raw), "v")
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		s = s[:end]
	}
	parts := strings.Split(strings.TrimSuffix(s, "."), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v
	}
	nums := [3]int{}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 1<<20 {
			return v
		}
		nums[i] = n
	}
	v.Known, v.Major, v.Minor, v.Patch = true, nums[0], nums[1], nums[2]
	return v
}

// less reports whether a known version v is older than w.
func (v agentVersion) less(w agentVersion) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

func (v agentVersion) String() string {
	if v.quoted != "" {
		return v.quoted
	}
	if v.Raw == "" {
		return `""`
	}
	return strconv.Quote(v.Raw)
}
