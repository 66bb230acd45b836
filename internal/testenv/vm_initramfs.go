package testenv

// The VM lane's initramfs: busybox, the kernel's modules in load order,
// the test binaries and the init script that runs them.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func (l VMLane) writeInitramfs(dst string) error {
	fs := newInitramfs()
	bb := BusyboxStatic()
	fs.copyFile("/bin/busybox", bb, 0o755)
	fs.symlink("/bin/sh", "busybox")
	for _, d := range []string{"/proc", "/sys", "/dev", "/tmp", "/run", "/root", "/newroot", vmBinDir} {
		fs.mkdir(d)
	}
	fs.writeFile("/init", []byte(vmInit), 0o755)
	for guest, host := range l.Files {
		st, err := os.Stat(host)
		if err != nil {
			return err
		}
		fs.copyFile(guest, host, uint32(st.Mode().Perm()))
	}
	mods, err := moduleOrder(l.Kernel.Modules, l.Modules)
	if err != nil {
		return err
	}
	var script strings.Builder
	script.WriteString("#!/bin/sh\n# written by testenv.VMLane: the guest's second stage\n")
	script.WriteString(vmInit2)
	if l.Stage2 != "" {
		script.WriteString(l.Stage2)
		fs.writeFile("/init2", []byte(script.String()), 0o755)
		return fs.writeTo(dst)
	}
	for i, m := range mods {
		g := fmt.Sprintf("%s/%02d-%s", vmModDir, i, filepath.Base(m))
		fs.copyFile(g, filepath.Join(l.Kernel.Modules, m), 0o644)
		fmt.Fprintf(&script, "insmod %s || echo 'SBSVM-WARN insmod %s failed'\n", g, m)
	}
	env := []string{PrebuiltBinEnv + "=" + vmBinDir, "HOME=/root", "PATH=" + vmBinDir + ":/usr/bin:/bin:/usr/sbin:/sbin"}
	if ci := os.Getenv("CI"); ci != "" {
		env = append(env, "CI="+ci)
	}
	if l.DiskBytes > 0 {
		env = append(env, VMDiskEnv+"="+vmDiskName)
	}
	for _, e := range append(env, l.Env...) {
		fmt.Fprintf(&script, "export %s\n", shellQuote(e))
	}
	script.WriteString("echo SBSVM-READY $(cat /sys/fs/cgroup/cgroup.subtree_control)\n")
	for _, r := range l.Runs {
		bin := vmTestDir + "/" + r.Name + ".test"
		fs.copyFile(bin, r.Binary, 0o755)
		timeout := r.Timeout
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		re := "^(" + strings.Join(r.Tests, "|") + ")$"
		fmt.Fprintf(&script, "echo SBSVM-BEGIN %s\n(cd /tmp && %s -test.v -test.count=1 -test.timeout %s -test.run %s 2>&1)\necho SBSVM-END %s $?\n",
			r.Name, bin, timeout, shellQuote(re), r.Name)
	}
	script.WriteString("echo SBSVM-DONE\nsync\npoweroff -f\n")
	fs.writeFile("/init2", []byte(script.String()), 0o755)
	return fs.writeTo(dst)
}

// vmInit is the initramfs's /init: runsc cannot pivot_root out of an
// initramfs, so the tree is copied to a tmpfs and entered with switch_root.
const vmInit = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t tmpfs -o size=80% tmpfs /newroot
for f in /*; do
	case "$f" in /proc|/sys|/dev|/newroot) /bin/busybox mkdir -p "/newroot$f" ;; *) /bin/busybox cp -a "$f" /newroot/ ;; esac
done
/bin/busybox umount /proc
exec /bin/busybox switch_root /newroot /init2
`

// vmInit2 is the start of the second stage: mounts, cgroup v2 with its
// controllers delegated to children, loopback up.
const vmInit2 = `/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpuset +cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up
`

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// moduleOrder returns the module files (relative to dir) to load for names,
// each after its dependencies, from dir/modules.dep.
func moduleOrder(dir string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
		byName[strings.TrimSuffix(filepath.Base(mod), ".ko")] = mod
	}
	var order []string
	seen := map[string]bool{}
	var add func(m string)
	add = func(m string) {
		if seen[m] {
			return
		}
		seen[m] = true
		ds := deps[m]
		// modules.dep lists every dependency, the ones loaded last first.
		for i := len(ds) - 1; i >= 0; i-- {
			add(ds[i])
		}
		order = append(order, m)
	}
	for _, n := range names {
		m, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("module %q is not in %s/modules.dep", n, dir)
		}
		add(m)
	}
	return order, nil
}
