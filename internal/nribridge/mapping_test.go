package nribridge

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sandboxstats/sandboxstats/internal/identity"
	"github.com/sandboxstats/sandboxstats/internal/source"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// testConfig watches runsc, kata* and, for the tests' stand-in, runc (the
// default runtime's empty handler).
func testConfig() Config {
	return Config{
		Handlers:       []string{"runsc", "kata*", "runc"},
		GVisorHandlers: []string{"runsc*"},
		KataHandlers:   []string{"kata*"},
		DefaultRuntime: "runc",
		Templates: []Source{
			{Annotation: true, Key: "sandboxstats.dev/template"},
			{Key: "sandboxstats.dev/template"},
		},
	}
}

const podUID = "0b8c1f0e-5e0c-4a4e-9c61-2f7f3d2d4a10"

func runscPod() *api.PodSandbox {
	return &api.PodSandbox{
		Id:             "5bf5e4b5c0d1",
		Name:           "web-0",
		Uid:            podUID,
		Namespace:      "shop",
		Labels:         map[string]string{"sandboxstats.dev/template": "python"},
		RuntimeHandler: "runsc",
		Linux:          &api.LinuxPodSandbox{CgroupsPath: "/k8s.io/5bf5e4b5c0d1"},
		Pid:            4242,
	}
}

func TestKindOf(t *testing.T) {
	c := testConfig()
	for handler, want := range map[string]Kind{
		"runsc":         KindGVisor,
		"kata":          KindKata,
		"kata-clh":      KindKata,
		"kata-qemu":     KindKata,
		"runc":          KindCgroup,
		"":              KindCgroup, // the default runtime, runc, is watched here
		"runsc-debug":   0,          // a gVisor glob, but not watched
		"crun":          0,
		"youki":         0,
		"kata/../runsc": 0, // path.Match: * does not cross /
	} {
		t.Run(handler, func(t *testing.T) {
			if got := c.KindOf(handler); got != want {
				t.Errorf("KindOf(%q) = %v, want %v", handler, got, want)
			}
		})
	}
	c.DefaultRuntime = "crun"
	if got := c.KindOf(""); got != 0 {
		t.Errorf("an empty handler with default runtime crun (not watched) is %v", got)
	}
}

func TestIdentityOf(t *testing.T) {
	long := strings.Repeat("n", 400)
	for _, tc := range []struct {
		name    string
		edit    func(*api.PodSandbox)
		want    *sandboxstatsv1.WorkloadIdentity
		wantErr string
	}{
		{
			name: "template name from the label, its namespace the pod's",
			want: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: "web-0", ActorNamespace: "shop", TemplateNamespace: "shop", TemplateName: "python"},
		},
		{
			name: "the annotation wins over the label and carries a namespace",
			edit: func(p *api.PodSandbox) {
				p.Annotations = map[string]string{"sandboxstats.dev/template": "templates/python-3.12"}
			},
			want: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: "web-0", ActorNamespace: "shop", TemplateNamespace: "templates", TemplateName: "python-3.12"},
		},
		{
			name: "no template",
			edit: func(p *api.PodSandbox) { p.Labels = nil },
			want: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: "web-0", ActorNamespace: "shop"},
		},
		{
			name: "an empty annotation falls through to the label",
			edit: func(p *api.PodSandbox) {
				p.Annotations = map[string]string{"sandboxstats.dev/template": ""}
			},
			want: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: "web-0", ActorNamespace: "shop", TemplateNamespace: "shop", TemplateName: "python"},
		},
		{
			name: "foreign bytes escaped, oversized ones cut",
			edit: func(p *api.PodSandbox) {
				p.Name = "web\x1b]0;pwned\x07"
				p.Namespace = "grüße"
				p.Annotations = map[string]string{"sandboxstats.dev/template": long + "/" + "py\nthon"}
			},
			want: &sandboxstatsv1.WorkloadIdentity{ActorUid: podUID, ActorName: `web\x1b]0;pwned\a`, ActorNamespace: `gr\u00fc\u00dfe`,
				TemplateNamespace: strings.Repeat("n", 229) + "...(+171 bytes)", TemplateName: `py\nthon`},
		},
		{
			name:    "no uid",
			edit:    func(p *api.PodSandbox) { p.Uid = "" },
			wantErr: "invalid-pod-uid",
		},
		{
			name:    "uid over 128 bytes (never cut: two pods would share an actor)",
			edit:    func(p *api.PodSandbox) { p.Uid = strings.Repeat("u", 129) },
			wantErr: "invalid-pod-uid",
		},
		{
			name:    "uid with a space",
			edit:    func(p *api.PodSandbox) { p.Uid = "a b" },
			wantErr: "invalid-pod-uid",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := runscPod()
			if tc.edit != nil {
				tc.edit(pod)
			}
			got, err := testConfig().IdentityOf(pod)
			if tc.wantErr != "" {
				if ReasonOf(err) != tc.wantErr {
					t.Fatalf("err %v (reason %q), want reason %q", err, ReasonOf(err), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
			if err := identityFromProto(got).Validate(); err != nil {
				t.Errorf("statsd would refuse it: %v", err)
			}
		})
	}
}

func TestCgroupPath(t *testing.T) {
	for _, tc := range []struct {
		in, want, wantErr string
	}{
		{in: "/k8s.io/5bf5e4b5c0d1", want: "/k8s.io/5bf5e4b5c0d1"},
		{in: "/kubepods/besteffort/pod0b8c/", want: "/kubepods/besteffort/pod0b8c"},
		{in: "kubepods-besteffort-pod0b8c.slice:cri-containerd:5bf5e4b5c0d1",
			want: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b8c.slice/cri-containerd-5bf5e4b5c0d1.scope"},
		{in: "kubepods-besteffort-pod0b8c.slice", want: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b8c.slice"},
		{in: ":cri-containerd:abc", want: "/system.slice/cri-containerd-abc.scope"},
		{in: "machine.slice::kata_abc", want: "/machine.slice/kata_abc.scope"},
		{in: "", wantErr: "no-cgroup"},
		{in: "/", wantErr: "invalid-cgroup"},
		{in: "/a/../../etc", wantErr: "invalid-cgroup"},
		{in: "/a/../..", wantErr: "invalid-cgroup"},
		{in: "relative/path", wantErr: "invalid-cgroup"},
		{in: "/a\nb", wantErr: "invalid-cgroup"},
		{in: "kubepods--x.slice:p:n", wantErr: "invalid-cgroup"},
		{in: "notaslice:p:n", wantErr: "invalid-cgroup"},
		{in: "a.slice:p:", wantErr: "invalid-cgroup"},
		{in: "a.slice:p:x/y", wantErr: "invalid-cgroup"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := CgroupPath(tc.in)
			if tc.wantErr != "" {
				if ReasonOf(err) != tc.wantErr {
					t.Fatalf("CgroupPath(%q) = %q, %v; want reason %s", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("CgroupPath(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestRefOf(t *testing.T) {
	gvisor := sandboxstatsv1.SandboxClass_SANDBOX_CLASS_GVISOR
	microvm := sandboxstatsv1.SandboxClass_SANDBOX_CLASS_MICROVM
	kata := Kata{AgentAddress: "hvsock:///run/vc/vm/kata1/clh.sock:1024", VMMPID: 5151, Hypervisor: "clh"}
	for _, tc := range []struct {
		name       string
		sandbox    Sandbox
		containers []Container
		kata       Kata
		want       *sandboxstatsv1.SandboxRef
		wantErr    string
	}{
		{
			name:    "gVisor: the sentry's pid",
			sandbox: Sandbox{Kind: KindGVisor, ID: "s1", PID: 4242, CgroupsPath: "/k8s.io/s1", CgroupParent: "/kubepods/pod1"},
			want:    &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, SentryPid: 4242},
		},
		{
			name:       "gVisor: the containers named, in the order given, each once, the pause container not among them",
			sandbox:    Sandbox{Kind: KindGVisor, ID: "s1", PID: 4242},
			containers: []Container{{ID: "c2", Name: "web"}, {ID: "c1", Name: "log\x00shipper"}, {ID: "c2", Name: "web"}},
			want: &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, SentryPid: 4242,
				Containers: []*sandboxstatsv1.ContainerRef{{Id: "c2", Name: "web"}, {Id: "c1", Name: `log\x00shipper`}}},
		},
		{
			name:    "gVisor without a pid: the sandbox's cgroups path, where the sentry lives",
			sandbox: Sandbox{Kind: KindGVisor, ID: "s1", CgroupsPath: "/k8s.io/s1", CgroupParent: "/kubepods/pod1"},
			want:    &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, CgroupPath: "/k8s.io/s1"},
		},
		{
			name:    "gVisor without a pid or a cgroup",
			sandbox: Sandbox{Kind: KindGVisor, ID: "s1"},
			wantErr: "no-cgroup",
		},
		{
			name:    "gVisor: a pid out of int32's range",
			sandbox: Sandbox{Kind: KindGVisor, ID: "s1", PID: 1 << 31},
			wantErr: "invalid-pid",
		},
		{
			name:    "cgroup: the pod-level cgroup (every container of the pod), not the pause container's",
			sandbox: Sandbox{Kind: KindCgroup, ID: "s1", PID: 99, CgroupsPath: "/kubepods/pod1/s1", CgroupParent: "/kubepods/pod1"},
			want:    &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, CgroupPath: "/kubepods/pod1"},
		},
		{
			name:    "cgroup without a parent (crictl): the sandbox's cgroups path",
			sandbox: Sandbox{Kind: KindCgroup, ID: "s1", PID: 99, CgroupsPath: "/k8s.io/s1"},
			want:    &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, CgroupPath: "/k8s.io/s1"},
		},
		{
			name:    "cgroup under systemd",
			sandbox: Sandbox{Kind: KindCgroup, ID: "s1", CgroupParent: "kubepods-burstable-pod1.slice"},
			want:    &sandboxstatsv1.SandboxRef{SandboxClass: gvisor, CgroupPath: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"},
		},
		{
			name:       "Kata: the agent, the sandbox's container first (no name), the pod's as given, as containers and as container_ids (an older statsd reads those), the VMM from Kata's layout",
			sandbox:    Sandbox{Kind: KindKata, ID: "kata1", PID: 777},
			containers: []Container{{ID: "c2", Name: "web"}, {ID: "c1", Name: "init"}, {ID: "c2", Name: "web"}, {ID: "kata1"}},
			kata:       kata,
			want: &sandboxstatsv1.SandboxRef{SandboxClass: microvm, AgentAddress: kata.AgentAddress, VmmPid: 5151,
				ContainerIds: []string{"kata1", "c2", "c1"},
				Containers:   []*sandboxstatsv1.ContainerRef{{Id: "kata1"}, {Id: "c2", Name: "web"}, {Id: "c1", Name: "init"}}},
		},
		{
			name:    "Kata: no VMM pid in the layout: NRI's pod pid (the VMM's)",
			sandbox: Sandbox{Kind: KindKata, ID: "kata1", PID: 777},
			kata:    Kata{AgentAddress: "vsock://1637421617:1024"},
			want: &sandboxstatsv1.SandboxRef{SandboxClass: microvm, AgentAddress: "vsock://1637421617:1024", VmmPid: 777,
				ContainerIds: []string{"kata1"}, Containers: []*sandboxstatsv1.ContainerRef{{Id: "kata1"}}},
		},
		{
			name:    "not watched",
			sandbox: Sandbox{ID: "s1"},
			wantErr: "unwatched",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RefOf(tc.sandbox, tc.containers, tc.kata)
			if tc.wantErr != "" {
				if ReasonOf(err) != tc.wantErr {
					t.Fatalf("err %v (reason %q), want reason %q", err, ReasonOf(err), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("ref (-want +got):\n%s", diff)
			}
			if err := identity.ValidateRef(refFromProto(got)); err != nil {
				t.Errorf("statsd would refuse it: %v", err)
			}
		})
	}
}

// TestContainerRefs: at most 25 containers passed (Kata: the sandbox's
// own among them), the first ones learnt; the rest and the ids statsd would
// refuse left out and counted.
func TestContainerRefs(t *testing.T) {
	var many []Container
	for i := range 40 {
		many = append(many, Container{ID: fmt.Sprintf("c%02d", i), Name: fmt.Sprintf("n%02d", i)})
	}
	many = append(many, Container{ID: "bad id"}, Container{ID: strings.Repeat("x", 129)})
	for _, tc := range []struct {
		kind       Kind
		first      string
		last       string
		wantLeft   int
		wantLength int
	}{
		{KindGVisor, "c00", "c24", 40 - 25 + 2, 25},
		{KindCgroup, "c00", "c24", 40 - 25 + 2, 25},
		{KindKata, "sbx", "c23", 40 - 24 + 2, 25},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			refs, left, err := ContainerRefs(Sandbox{Kind: tc.kind, ID: "sbx"}, many)
			if err != nil {
				t.Fatal(err)
			}
			if len(refs) != tc.wantLength || refs[0].GetId() != tc.first || refs[len(refs)-1].GetId() != tc.last || left != tc.wantLeft {
				t.Errorf("%d refs (%s .. %s), %d left out; want %d (%s .. %s), %d left out",
					len(refs), refs[0].GetId(), refs[len(refs)-1].GetId(), left, tc.wantLength, tc.first, tc.last, tc.wantLeft)
			}
		})
	}
	if _, _, err := ContainerRefs(Sandbox{Kind: KindKata}, nil); ReasonOf(err) != "invalid-sandbox-id" {
		t.Errorf("Kata, empty sandbox id: %v", err)
	}
}

func TestParseSource(t *testing.T) {
	for in, want := range map[string]Source{
		"label:app":                            {Key: "app"},
		"annotation:sandboxstats.dev/template": {Annotation: true, Key: "sandboxstats.dev/template"},
		"label:a:b":                            {Key: "a:b"},
	} {
		t.Run(in, func(t *testing.T) {
			got, err := ParseSource(in)
			if err != nil || got.String() != in {
				t.Fatalf("ParseSource(%q) = %+v, %v (String %q)", in, got, err, got.String())
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ParseSource(%q) (-want +got):\n%s", in, diff)
			}
		})
	}
	for _, in := range []string{"", "app", "label:", "env:X"} {
		t.Run("refused "+in, func(t *testing.T) {
			if _, err := ParseSource(in); err == nil {
				t.Errorf("ParseSource(%q) accepted", in)
			}
		})
	}
}

// FuzzIdentityOf: whatever a pod's name, namespace and template say, the
// identity is one statsd accepts, or the pod is refused for its uid alone.
func FuzzIdentityOf(f *testing.F) {
	f.Add(podUID, "web-0", "shop", "python")
	f.Add(podUID, "web\x1b]0;x\x07", "grüße", "ns/"+strings.Repeat("ü", 300))
	f.Add("", "", "", "")
	f.Add("a b", "x", "y", "/")
	f.Fuzz(func(t *testing.T, uid, name, namespace, template string) {
		pod := &api.PodSandbox{Uid: uid, Name: name, Namespace: namespace, Annotations: map[string]string{"sandboxstats.dev/template": template}}
		id, err := testConfig().IdentityOf(pod)
		if err != nil {
			if ReasonOf(err) != "invalid-pod-uid" {
				t.Fatalf("err %v", err)
			}
			if identity.ValidateActorUID(uid) == nil {
				t.Fatalf("uid %q refused, statsd takes it: %v", uid, err)
			}
			return
		}
		if err := identityFromProto(id).Validate(); err != nil {
			t.Fatalf("IdentityOf(%q, %q, %q, %q) = %v: statsd refuses it: %v", uid, name, namespace, template, id, err)
		}
	})
}

// identityFromProto and refFromProto convert as internal/server does, for
// statsd's own validator.
func identityFromProto(id *sandboxstatsv1.WorkloadIdentity) identity.Identity {
	return identity.Identity{ActorUID: id.GetActorUid(), ActorName: id.GetActorName(), ActorNamespace: id.GetActorNamespace(),
		TemplateNamespace: id.GetTemplateNamespace(), TemplateName: id.GetTemplateName()}
}

func refFromProto(r *sandboxstatsv1.SandboxRef) source.SandboxRef {
	var cs []source.ContainerRef
	for _, c := range r.GetContainers() {
		cs = append(cs, source.ContainerRef{ID: c.GetId(), Name: c.GetName()})
	}
	return source.SandboxRef{Class: source.Class(r.GetSandboxClass()), CgroupPath: r.GetCgroupPath(), SentryPID: int(r.GetSentryPid()),
		AgentAddress: r.GetAgentAddress(), ContainerIDs: r.GetContainerIds(), Containers: cs, VMMPID: int(r.GetVmmPid()),
		VMMPIDFile: r.GetVmmPidFile(), QMPSocket: r.GetQmpSocket()}
}
