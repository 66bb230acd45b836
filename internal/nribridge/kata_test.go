package nribridge

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// The fixture sandboxes (testdata/kata/README.md).
const (
	clhID    = "c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0c1a0"
	fcID     = "f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0f1c0"
	qemuID   = "9e309e309e309e309e309e309e309e309e309e309e309e309e309e309e309e30"
	noPortID = "d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0"
	remoteID = "e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0"
	badID    = "baadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaadbaad"
)

func fixtureLayout() KataLayout { return KataLayout{Root: filepath.Join("testdata", "kata", "run-vc")} }

// TestKataLayoutFixtures: persist.json of each hypervisor gives the agent's
// address as statsd takes it and the VMM's pid.
func TestKataLayoutFixtures(t *testing.T) {
	for _, tc := range []struct {
		name, id   string
		want       Kata
		wantErr    string
		wantNotYet bool // ErrKataNotYet: tried again
	}{
		{name: "Cloud Hypervisor: hybrid vsock", id: clhID,
			want: Kata{AgentAddress: "hvsock:///run/vc/vm/" + clhID + "/clh.sock:1024", VMMPID: 4242, Hypervisor: "clh"}},
		{name: "Firecracker: hybrid vsock in the jailer's root", id: fcID,
			want: Kata{AgentAddress: "hvsock:///run/vc/firecracker/" + fcID + "/root/kata.hvsock:1024", VMMPID: 5151, Hypervisor: "firecracker"}},
		{name: "QEMU: vsock, the CID Kata claimed", id: qemuID,
			want: Kata{AgentAddress: "vsock://1637421617:1024", VMMPID: 6262, Hypervisor: "qemu"}},
		{name: "an hvsock URL without a port gets Kata's 1024", id: noPortID,
			want: Kata{AgentAddress: "hvsock:///run/vc/vm/" + noPortID + "/clh.sock:1024", VMMPID: 7373, Hypervisor: "clh"}},
		{name: "a remote hypervisor's agent: not one statsd dials", id: remoteID, wantErr: "kata-agent-url"},
		{name: "a persist.json cut short: being written, tried again", id: badID, wantNotYet: true},
		{name: "a sandbox id that would leave the root", id: "..", wantErr: "invalid-sandbox-id"},
		{name: "a sandbox id with a slash", id: "a/b", wantErr: "invalid-sandbox-id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fixtureLayout().Resolve(tc.id)
			if tc.wantNotYet {
				if !errors.Is(err, ErrKataNotYet) || !strings.Contains(err.Error(), tc.id) {
					t.Fatalf("Resolve(%s) = %+v, %v; want ErrKataNotYet naming the sandbox's file", tc.id, got, err)
				}
				return
			}
			if tc.wantErr != "" {
				if ReasonOf(err) != tc.wantErr {
					t.Fatalf("Resolve(%s) = %+v, %v (reason %q); want reason %q", tc.id, got, err, ReasonOf(err), tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.id) && tc.id != ".." && tc.id != "a/b" {
					t.Errorf("error %q does not name the sandbox's file", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Resolve (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKataPodToRequest: a Kata pod and its containers, through the
// fixture layout, to the RunWorkloadRequest statsd validates.
func TestKataPodToRequest(t *testing.T) {
	c := testConfig()
	pod := &api.PodSandbox{Id: clhID, Uid: podUID, Name: "vm-0", Namespace: "shop", RuntimeHandler: "kata-clh", Pid: 4242,
		Annotations: map[string]string{"sandboxstats.dev/template": "templates/vm"}}
	kind := c.KindOf(pod.GetRuntimeHandler())
	if kind != KindKata {
		t.Fatalf("kind %v", kind)
	}
	id, err := c.IdentityOf(pod)
	if err != nil {
		t.Fatal(err)
	}
	kata, err := fixtureLayout().Resolve(pod.GetId())
	if err != nil {
		t.Fatal(err)
	}
	ref, err := RefOf(SandboxOf(kind, pod), []Container{{ID: "app2", Name: "web"}, {ID: "app1", Name: "sidecar"}}, kata)
	if err != nil {
		t.Fatal(err)
	}
	want := &sandboxstatsv1.RunWorkloadRequest{
		Identity: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: "vm-0", ActorNamespace: "shop", TemplateNamespace: "templates", TemplateName: "vm"},
		Sandbox: &sandboxstatsv1.SandboxRef{SandboxClass: sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM,
			AgentAddress: "hvsock:///run/vc/vm/" + clhID + "/clh.sock:1024", ContainerIds: []string{clhID, "app2", "app1"},
			Containers: []*sandboxstatsv1.ContainerRef{{Id: clhID}, {Id: "app2", Name: "web"}, {Id: "app1", Name: "sidecar"}}, VmmPid: 4242},
	}
	got := &sandboxstatsv1.RunWorkloadRequest{Identity: id, Sandbox: ref}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
	if err := identity.ValidateRef(refFromProto(ref)); err != nil {
		t.Errorf("statsd would refuse the ref: %v", err)
	}
}

// TestKataLayoutSockets: without persist.json, the hybrid-vsock socket of
// Cloud Hypervisor or Firecracker names the agent (no VMM pid then);
// neither there is "not yet", so the bridge tries again.
// TestKataPersistBeingWritten: a persist.json empty or cut short at its
// end is Kata writing it: ErrKataNotYet (tried again), not unactionable; one
// that is whole but wrong stays unactionable.
func TestKataPersistBeingWritten(t *testing.T) {
	whole := `{"HypervisorState":{"Type":"clh","Pid":4242},"AgentState":{"URL":"hvsock:///run/vc/vm/k/clh.sock:1024"}}`
	for _, tc := range []struct {
		name, body string
		notYet     bool
	}{
		{"empty", "", true},
		{"cut short", whole[:40], true},
		{"whole", whole, false},
		{"not JSON", "{]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "sbs", "k")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "persist.json"), []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := KataLayout{Root: root}.Resolve("k")
			if got := errors.Is(err, ErrKataNotYet); got != tc.notYet {
				t.Errorf("Resolve: %v; not yet %v, want %v", err, got, tc.notYet)
			}
			if tc.name == "whole" && err != nil {
				t.Errorf("Resolve: %v", err)
			}
		})
	}
}

func TestKataLayoutSockets(t *testing.T) {
	root := t.TempDir()
	mksock := func(rel string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(p, syscall.S_IFSOCK|0o600, 0); err != nil {
			t.Skipf("mknod a socket: %v", err)
		}
	}
	mksock(filepath.Join("vm", "clh1", "clh.sock"))
	mksock(filepath.Join("firecracker", "fc1", "root", "kata.hvsock"))
	if err := os.MkdirAll(filepath.Join(root, "vm", "file1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "vm", "file1", "clh.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l := KataLayout{Root: root}
	for id, want := range map[string]Kata{
		"clh1": {Hypervisor: "clh", AgentAddress: "hvsock://" + filepath.Join(root, "vm", "clh1", "clh.sock") + ":1024"},
		"fc1":  {Hypervisor: "firecracker", AgentAddress: "hvsock://" + filepath.Join(root, "firecracker", "fc1", "root", "kata.hvsock") + ":1024"},
	} {
		got, err := l.Resolve(id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", id, diff)
		}
	}
	for _, id := range []string{"none", "file1"} {
		if _, err := l.Resolve(id); !errors.Is(err, ErrKataNotYet) || !strings.Contains(err.Error(), root) {
			t.Errorf("%s: %v, want ErrKataNotYet naming the root", id, err)
		}
	}
	// A FIFO where persist.json should be is refused, not waited on.
	if err := os.MkdirAll(filepath.Join(root, "sbs", "fifo1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "sbs", "fifo1", "persist.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Resolve("fifo1"); err == nil || errors.Is(err, ErrKataNotYet) || !strings.Contains(err.Error(), "persist.json") {
		t.Errorf("a FIFO persist.json: %v", err)
	}
	if _, err := (KataLayout{Root: filepath.Join(root, "absent")}).Resolve("x"); !errors.Is(err, ErrKataNotYet) {
		t.Errorf("no Kata root: %v, want ErrKataNotYet", err)
	}
}

func TestAgentAddress(t *testing.T) {
	for in, want := range map[string]string{
		"hvsock:///run/vc/vm/x/clh.sock:1024": "hvsock:///run/vc/vm/x/clh.sock:1024",
		"hvsock:///run/vc/vm/x/clh.sock":      "hvsock:///run/vc/vm/x/clh.sock:1024",
		"vsock://3:1024":                      "vsock://3:1024",
		"vsock://2:1024":                      "",
		"vsock://x:1024":                      "",
		"hvsock://relative/clh.sock:1024":     "",
		"hvsock:///a/../b:1024":               "",
		"hvsock:///a:0":                       "",
		"mock:///tmp/agent.sock":              "",
		"remote:///run/x.sock":                "",
		"/run/vc/vm/x/clh.sock":               "",
		"hvsock:///a\n:1024":                  "",
		"":                                    "",
	} {
		t.Run(in, func(t *testing.T) {
			got, err := agentAddress(in)
			if (err != nil) != (want == "") || got != want {
				t.Errorf("agentAddress(%q) = %q, %v; want %q", in, got, err, want)
			}
		})
	}
}
