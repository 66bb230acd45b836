// Command cripod renders a kustomization (as kubectl apply -k) and writes
// its DaemonSet's pod as a kubelet would hand it to the runtime: crictl's
// configs for runp and create, and the pod's volumes made on this node
// (package cripod). The end-to-end test runs it with go run from deploy/.
//
//	go run ./kubernetes/cripod/cmd/cripod --kustomization kubernetes --out /tmp/pod \
//	    --host-path /var/lib=/tmp/pod/var-lib --node-network
//
// It writes OUT/cri/plan.json (the plan: the sandbox's config, each init
// container's and container's configs, one per attempt, and the volumes)
// and the configs beside it, makes the volumes (Pod.Materialize), and
// prints the plan's path.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/deploy/kubernetes/cripod"
)

// Plan is plan.json.
type Plan struct {
	Sandbox        string          `json:"sandbox"` // the sandbox's config (crictl runp)
	InitContainers []PlanContainer `json:"initContainers"`
	Containers     []PlanContainer `json:"containers"`
	Volumes        []cripod.Volume `json:"volumes"`
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	Namespace      string          `json:"namespace"`
}

// PlanContainer is a container's configs (crictl create), the one of
// attempt n at Attempts[n].
type PlanContainer struct {
	Name     string   `json:"name"`
	Image    string   `json:"image"`
	Attempts []string `json:"attempts"`
}

type hostPathsFlag map[string]string

func (h hostPathsFlag) String() string { return fmt.Sprint(map[string]string(h)) }
func (h hostPathsFlag) Set(v string) error {
	from, to, ok := strings.Cut(v, "=")
	if !ok || !filepath.IsAbs(from) || !filepath.IsAbs(to) {
		return errors.New("want FROM=TO, both absolute")
	}
	h[filepath.Clean(from)] = filepath.Clean(to)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cripod:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("cripod", flag.ContinueOnError)
	var (
		kust, out, name, uid, node, cgroup, kubeSvc string
		nodeNet, noSeccomp, rro                     bool
		attempts                                    int
	)
	hostPaths := hostPathsFlag{}
	fs.StringVar(&kust, "kustomization", "", "the kustomization's directory (required)")
	fs.StringVar(&out, "out", "", "the pod's directory on the node, absolute (required)")
	fs.StringVar(&name, "name", "", "the pod's name (default: the DaemonSet's and 5 random characters)")
	fs.StringVar(&uid, "uid", "", "the pod's uid (default: random)")
	fs.StringVar(&node, "node-name", "", "the node's name (default: the host name)")
	fs.StringVar(&cgroup, "cgroup-parent", "", "the sandbox's cgroup parent (default: the runtime's)")
	fs.BoolVar(&nodeNet, "node-network", false, "run the pod in the node's network namespace (a runtime without CNI)")
	fs.BoolVar(&noSeccomp, "without-seccomp", false, "leave every seccomp profile out (a runtime built without seccomp)")
	fs.BoolVar(&rro, "recursive-read-only-mounts", false, "the runtime handler supports recursive read-only mounts (crictl info: runtimeHandlers' features): a recursiveReadOnly IfPossible mount is made recursive")
	fs.StringVar(&kubeSvc, "kubernetes-service", "", "the Service kubernetes's ClusterIP:port, for the KUBERNETES_SERVICE_* variables (default 10.96.0.1:443)")
	fs.IntVar(&attempts, "attempts", 1, "configs written per container: attempts 0 .. N-1 (a restart is the next attempt)")
	fs.Var(hostPaths, "host-path", "FROM=TO: take a hostPath at or below FROM from TO instead (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if kust == "" || !filepath.IsAbs(out) || attempts < 1 || fs.NArg() > 0 {
		return errors.New("--kustomization and an absolute --out are required; --attempts at least 1")
	}
	objs, err := cripod.Build(kust)
	if err != nil {
		return err
	}
	if name == "" {
		name = objs.DaemonSet.Name + "-" + rand.Text()[:5]
		name = strings.ToLower(name)
	}
	if uid == "" {
		b := make([]byte, 16)
		rand.Read(b)
		b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
		uid = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	}
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return err
		}
	}
	pod, err := cripod.FromDaemonSet(objs.DaemonSet, objs.ConfigMaps, cripod.Options{
		Name: name, UID: uid, NodeName: node, PodDir: out, HostPaths: hostPaths,
		NodeNetwork: nodeNet, WithoutSeccomp: noSeccomp, CgroupParent: cgroup, NodeMemoryBytes: memTotal(),
		RecursiveReadOnlyMounts: rro, KubernetesService: kubeSvc,
	})
	if err != nil {
		return err
	}
	if err := pod.Materialize(); err != nil {
		return err
	}
	dir := filepath.Join(out, "cri")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(file string, v any) (string, error) {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return "", err
		}
		p := filepath.Join(dir, file)
		return p, os.WriteFile(p, append(b, '\n'), 0o644)
	}
	plan := Plan{Volumes: pod.Volumes, Name: name, UID: uid, Namespace: pod.Sandbox.Metadata.Namespace}
	if plan.Sandbox, err = write("sandbox.json", pod.Sandbox); err != nil {
		return err
	}
	configs := func(kind string, cs []*cripod.Container) ([]PlanContainer, error) {
		var pcs []PlanContainer
		for i, c := range cs {
			pc := PlanContainer{Name: c.Name, Image: c.Config.Image.Image}
			for n := range attempts {
				cfg := c.Config
				if n > 0 {
					cfg = c.Restarted(uint32(n))
				}
				p, err := write(fmt.Sprintf("%s-%02d-%s.%d.json", kind, i, c.Name, n), cfg)
				if err != nil {
					return nil, err
				}
				pc.Attempts = append(pc.Attempts, p)
			}
			pcs = append(pcs, pc)
		}
		return pcs, nil
	}
	if plan.InitContainers, err = configs("init", pod.InitContainers); err != nil {
		return err
	}
	if plan.Containers, err = configs("container", pod.Containers); err != nil {
		return err
	}
	p, err := write("plan.json", plan)
	if err != nil {
		return err
	}
	fmt.Println(p)
	return nil
}

// memTotal is the node's memory in bytes (/proc/meminfo), 0 if unknown.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
