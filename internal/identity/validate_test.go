package identity

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

func TestValidateActorUID(t *testing.T) {
	for _, tc := range []struct {
		uid string
		ok  bool
	}{
		{"actor-1", true},
		{strings.Repeat("a", 128), true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{"with space", false},
		{"tab\there", false},
		{"ünicode", false},
	} {
		t.Run(tc.uid, func(t *testing.T) {
			err := ValidateActorUID(tc.uid)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateActorUID(%q) = %v, want ok=%v", tc.uid, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestValidateRef(t *testing.T) {
	gv := func(p string, pid int) source.SandboxRef {
		return source.SandboxRef{Class: source.ClassGVisor, CgroupPath: p, SentryPID: pid}
	}
	vm := func(addr string, ids ...string) source.SandboxRef {
		return source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: addr, ContainerIDs: ids}
	}
	many := make([]string, 26)
	for i := range many {
		many[i] = "c" + strings.Repeat("x", i+1)
	}
	for _, tc := range []struct {
		name string
		ref  source.SandboxRef
		ok   bool
	}{
		{"gvisor by path", gv("/kubepods/pod1", 0), true},
		{"gvisor by pid", gv("", 42), true},
		{"gvisor neither", gv("", 0), false},
		{"gvisor both", gv("/a", 42), false},
		{"relative path", gv("kubepods", 0), false},
		{"root cgroup", gv("/", 0), false},
		{"dotdot", gv("/a/../../etc", 0), false},
		{"unclean", gv("/a//b", 0), false},
		{"unclean with a trailing slash", gv("/a//b/", 0), false},
		{"trailing slash", gv("/a/", 0), false},
		{"negative pid", gv("", -1), false},
		{"gvisor with agent", source.SandboxRef{Class: source.ClassGVisor, SentryPID: 1, AgentAddress: "vsock://3:1024"}, false},
		{"sentry pinned (a persisted binding)", source.SandboxRef{Class: source.ClassGVisor, SentryPID: 42, SentryStartTicks: 5000}, true},
		{"a sentry start time by path", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", SentryStartTicks: 5000}, false},
		{"a sentry start time on a microvm", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1024", ContainerIDs: []string{"c1"}, SentryStartTicks: 5000}, false},
		{"hvsock", vm("hvsock:///run/vc/vm/x/clh.sock:1024", "c1"), true},
		{"vsock", vm("vsock://3:1024", "c1", "c2"), true},
		{"unknown scheme", vm("tcp://1.2.3.4:1024", "c1"), false},
		{"hvsock relative", vm("hvsock://clh.sock:1024", "c1"), false},
		{"vsock bad cid", vm("vsock://x:1024", "c1"), false},
		{"no port", vm("vsock://3", "c1"), false},
		{"port too big", vm("vsock://3:4294967296", "c1"), false},
		{"no containers", vm("vsock://3:1024"), false},
		{"26 containers", vm("vsock://3:1024", many...), false},
		{"25 containers", vm("vsock://3:1024", many[:25]...), true},
		{"duplicate container", vm("vsock://3:1024", "c1", "c1"), false},
		{"empty container id", vm("vsock://3:1024", ""), false},
		{"microvm with a cgroup path", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1024", ContainerIDs: []string{"c1"}, CgroupPath: "/a"}, false},
		{"vmm pid and file", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: []string{"c"}, VMMPID: 7, VMMPIDFile: "/run/q.pid"}, false},
		{"vmm pid file relative", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: []string{"c"}, VMMPIDFile: "q.pid"}, false},
		{"no class", source.SandboxRef{CgroupPath: "/a"}, false},
		{"microvm containers with names", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", Containers: []source.ContainerRef{{ID: "c1", Name: "web"}, {ID: "c2"}}}, true},
		{"microvm containers listed twice", source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", Containers: []source.ContainerRef{{ID: "c1"}, {ID: "c1", Name: "x"}}}, false},
		{"gvisor names", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", Containers: []source.ContainerRef{{ID: "4c1e0f", Name: "app"}}}, true},
		{"gvisor name not printable", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", Containers: []source.ContainerRef{{ID: "4c1e0f", Name: "a\x00"}}}, false},
		{"gvisor container id of 129 bytes", source.SandboxRef{Class: source.ClassGVisor, CgroupPath: "/a", Containers: []source.ContainerRef{{ID: strings.Repeat("c", 129)}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRef(tc.ref)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateRef(%+v) = %v, want ok=%v", tc.ref, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

// FuzzValidateRequest checks lifecycle request validation never panics, and
// that whatever it accepts is safe to use: a clean absolute cgroup path with
// no "..", a known address scheme, printable identity fields.
func FuzzValidateRequest(f *testing.F) {
	f.Add("actor-1", "name", "/kubepods/pod1", 0, "", "", 0)
	f.Add("actor-1", "", "", 42, "", "", 0)
	f.Add("a", "", "", 0, "hvsock:///run/x.sock:1024", "c1", 0)
	f.Add("a", "", "", 0, "vsock://3:1024", "c1", 7)
	f.Add("", "\x00", "/a/../b", -1, "tcp://x:1", "", -5)
	f.Fuzz(func(t *testing.T, uid, name, cgroupPath string, pid int, addr, container string, vmmPID int) {
		id := Identity{ActorUID: uid, ActorName: name}
		ref := source.SandboxRef{Class: source.ClassGVisor, CgroupPath: cgroupPath, SentryPID: pid, VMMPID: vmmPID}
		if addr != "" {
			ref = source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: addr, ContainerIDs: []string{container}, VMMPID: vmmPID}
		}
		idErr, refErr := id.Validate(), ValidateRef(ref)
		if idErr == nil {
			if len(uid) == 0 || len(uid) > maxActorUIDBytes || strings.ContainsAny(uid, " \t\n\x00") {
				t.Fatalf("accepted actor uid %q", uid)
			}
		}
		if refErr != nil {
			return
		}
		if ref.CgroupPath != "" && (!strings.HasPrefix(ref.CgroupPath, "/") || strings.Contains(ref.CgroupPath, "..") && strings.Contains("/"+ref.CgroupPath+"/", "/../")) {
			t.Fatalf("accepted cgroup path %q", ref.CgroupPath)
		}
		if ref.AgentAddress != "" && !strings.HasPrefix(ref.AgentAddress, "hvsock:///") && !strings.HasPrefix(ref.AgentAddress, "vsock://") {
			t.Fatalf("accepted agent address %q", ref.AgentAddress)
		}
		if ref.SentryPID < 0 || ref.VMMPID < 0 {
			t.Fatalf("accepted a negative pid: %+v", ref)
		}
	})
}

// TestValidateWorkerPool: the optional worker pool has the bounds of the
// other identity names (253 bytes, printable ASCII and spaces).
func TestValidateWorkerPool(t *testing.T) {
	for _, tc := range []struct {
		name, pool string
		ok         bool
	}{
		{"none", "", true},
		{"a pool", "pool-eu-1", true},
		{"253 bytes", strings.Repeat("p", 253), true},
		{"254 bytes", strings.Repeat("p", 254), false},
		{"a newline", "pool\n1", false},
		{"not ASCII", "pöol", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Identity{ActorUID: "actor-1", WorkerPool: tc.pool}.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate(worker_pool %q) = %v, want ok=%v", tc.pool, err, tc.ok)
			}
			if err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "worker_pool")) {
				t.Fatalf("error %v does not wrap ErrInvalid or name worker_pool", err)
			}
		})
	}
}

// TestValidateRefBothContainerForms: a micro-VM ref may give container_ids
// beside containers (a bridge that also speaks to an older statsd) when
// both name the same ids in the same order; the error names the mismatch.
func TestValidateRefBothContainerForms(t *testing.T) {
	vm := func(ids []string, set ...source.ContainerRef) source.SandboxRef {
		return source.SandboxRef{Class: source.ClassMicroVM, AgentAddress: "vsock://3:1", ContainerIDs: ids, Containers: set}
	}
	sbx, web, db := source.ContainerRef{ID: "sbx"}, source.ContainerRef{ID: "c1", Name: "web"}, source.ContainerRef{ID: "c2", Name: "db"}
	for _, tc := range []struct {
		name string
		ref  source.SandboxRef
		want string // "" = valid; else a part of the error
	}{
		{"both agree", vm([]string{"sbx", "c1", "c2"}, sbx, web, db), ""},
		{"containers only", vm(nil, sbx, web, db), ""},
		{"container_ids only", vm([]string{"sbx", "c1", "c2"}), ""},
		{"neither", vm(nil), "needs 1 to 25 container_ids, got 0"},
		{"order differs", vm([]string{"sbx", "c2", "c1"}, sbx, web, db), `container_ids[1] is "c2", containers[1].id is "c1"`},
		{"an id differs", vm([]string{"sbx", "c1", "c9"}, sbx, web, db), `container_ids[2] is "c9", containers[2].id is "c2"`},
		{"container_ids shorter", vm([]string{"sbx", "c1"}, sbx, web, db), `containers[2] is "c2", container_ids has 2 ids`},
		{"container_ids longer", vm([]string{"sbx", "c1", "c2", "c3"}, sbx, web, db), `container_ids[3] is "c3", containers has 3`},
		{"both agree, an id listed twice", vm([]string{"c1", "c1"}, web, web), `containers[1]: id "c1" is listed twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRef(tc.ref)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("ValidateRef = %v, want valid", err)
			case tc.want == "":
			case err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("ValidateRef = %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}
