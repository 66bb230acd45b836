package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// needNetNS checks the prerequisites of network namespace tests: root and
// the ip, nsenter and unshare tools.
func needNetNS(t testing.TB) {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root to make network namespaces (run the tests as root)")
	for _, tool := range []string{"ip", "nsenter", "unshare"} {
		_, err := exec.LookPath(tool)
		Need(t, err == nil, "needs "+tool+" in PATH (apt-get install iproute2 util-linux)")
	}
}

// NetNS is a named network namespace the test made (ip netns add).
type NetNS struct {
	Name, Path string // Path is /run/netns/<Name>
	Addr       string // its end of the veth pair, e.g. 169.254.77.1
	Link       string // the name of that end
}

// NetNSPair makes two network namespaces joined by a veth pair with the
// link-local addresses 169.254.77.1/30 (first) and .2 (second), loopback up
// in both. Nothing is added to the root namespace and nothing is routed
// anywhere else. The test's cleanup deletes both namespaces, which removes
// the veth pair; register it before anything that must go first (a sandbox
// in the first namespace).
func NetNSPair(t testing.TB) (a, b NetNS) {
	t.Helper()
	needNetNS(t)
	tag := strconv.Itoa(os.Getpid()%100000) + strconv.Itoa(int(time.Now().UnixNano()%1000))
	a = NetNS{Name: "sbstest-a" + tag, Addr: "169.254.77.1", Link: "sbsa" + tag}
	b = NetNS{Name: "sbstest-b" + tag, Addr: "169.254.77.2", Link: "sbsb" + tag}
	for _, ns := range []*NetNS{&a, &b} {
		ns.Path = filepath.Join("/run/netns", ns.Name)
		if err := ip("netns", "add", ns.Name); err != nil {
			t.Fatal(err)
		}
		name := ns.Name
		t.Cleanup(func() {
			if err := ip("netns", "del", name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	steps := [][]string{
		{"link", "add", a.Link, "type", "veth", "peer", "name", b.Link},
		{"link", "set", a.Link, "netns", a.Name},
		{"link", "set", b.Link, "netns", b.Name},
	}
	for _, ns := range []NetNS{a, b} {
		steps = append(steps,
			[]string{"-n", ns.Name, "addr", "add", ns.Addr + "/30", "dev", ns.Link},
			[]string{"-n", ns.Name, "link", "set", ns.Link, "up"},
			[]string{"-n", ns.Name, "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			ip("link", "del", a.Link) // if it is still in the root namespace
			t.Fatal(err)
		}
	}
	return a, b
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %v: %w: %s", args, err, bytes.TrimSpace(out))
	}
	return nil
}

// inNetNS returns a command running bin with args in the network namespace
// at ns (nsenter --net, which keeps the caller's mounts, unlike ip netns
// exec, whose fresh /sys hides the cgroup mounts runsc needs).
//
// For `runsc run` (networkSetup) it also works around Debian runsc
// 0.0~20221219's test for the root network namespace: isRootNS
// (runsc/sandbox/network.go) takes the existence of
// /proc/sys/net/core/rmem_default as "root namespace", but Linux 6.x shows
// that file, read-only, in every namespace, so runsc refuses
// --network=sandbox everywhere ("cannot run with network enabled in root
// network namespace"). The command runs in a private mount namespace, made
// inside ns, in which an empty tmpfs covers /proc/sys/net/core of ns: the
// probe then finds nothing, as on the kernels runsc was written for. Nothing
// outside that short-lived mount namespace sees it.
func inNetNS(ns string, networkSetup bool, bin string, args ...string) *exec.Cmd {
	if !networkSetup {
		return exec.Command("nsenter", append([]string{"--net=" + ns, "--", bin}, args...)...)
	}
	script := `mount -t tmpfs -o size=4k,mode=0555 sbstest-hide-net-core /proc/sys/net/core && exec "$0" "$@"`
	return exec.Command("nsenter", append([]string{"--net=" + ns, "--", "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", script, bin}, args...)...)
}
