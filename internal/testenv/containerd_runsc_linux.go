package testenv

// The "runsc" handler's runtime binary: Debian's runsc through a wrapper
// script the runc shim runs (split from containerd_linux.go).

import "os/exec"

// runscWrapper is the "runsc" handler's BinaryName: Debian's runsc on this
// host's platform and network with the private root (the shim passes the
// same root after it: Root/<namespace>), made to work under the runc shim:
//   - Debian's runsc 20221219 cannot apply the negative
//     process.oomScoreAdj the CRI gives a sandbox: the wrapper deletes it
//     from the bundle's config.json before create;
//   - runsc start of a pod's container starts the container's gofer, which
//     would inherit the pipe the shim reads runsc's output from to its end
//     (the shim's Start never returns): the output goes through a file;
//   - runsc create of a pod's container writes the sandbox's pid as the
//     container's, whose exit the shim waits for to call it stopped (a
//     crictl stop never returns): the pid written is a process's that waits
//     for the container (runsc wait) and exits with it.
func (c *Containerd) runscWrapper() string {
	jq, _ := exec.LookPath("jq")
	return `#!/bin/sh
# testenv.StartContainerd's runsc for the runc shim.
printf '%s\n' "$*" >>` + shellQuote(c.wrapperLog) + `
jq=` + shellQuote(jq) + `
bundle=
pidfile=
prev=
for a in "$@"; do
	case "$prev" in --bundle|-b) bundle=$a ;; --pid-file) pidfile=$a ;; esac
	case "$a" in --bundle=*) bundle=${a#--bundle=} ;; --pid-file=*) pidfile=${a#--pid-file=} ;; esac
	prev=$a
	cid=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	"$jq" 'del(.process.oomScoreAdj)' "$bundle/config.json" >"$bundle/config.json.tmp" &&
		mv "$bundle/config.json.tmp" "$bundle/config.json" || exit 1
fi
runsc() { ` + shellQuote(c.runsc) + ` --platform=ptrace --network=none --root ` + shellQuote(c.RunscRoot) + ` "$@"; }
case " $* " in
*" start "*)
	# runsc start of a pod's container starts its gofer, which inherits
	# the output pipe the shim reads to its end: the shim would wait for
	# it forever. Its output goes through a file instead.
	out=$(mktemp) || exit 1
	runsc "$@" >"$out" 2>&1
	rc=$?
	cat "$out" >&2
	rm -f "$out"
	exit $rc ;;
*" create "*)
	# A pod's container: runsc writes the sandbox's pid as its pid, whose
	# exit the shim would wait for to call the container stopped (never,
	# while the pod runs). Its pid is instead a process that waits for the
	# container (runsc wait, once it started) and exits with it: the shim,
	# a subreaper, reaps it.
	if [ -n "$pidfile" ] && "$jq" -e '.annotations["io.kubernetes.cri.container-type"] == "container"' "$bundle/config.json" >/dev/null 2>&1; then
		runsc "$@" || exit $?
		(
			while st=$(runsc state "$cid" 2>/dev/null | "$jq" -r .status) && [ "$st" = created ]; do sleep 0.05; done
			exec ` + shellQuote(c.runsc) + ` --platform=ptrace --network=none --root ` + shellQuote(c.RunscRoot) + ` wait "$cid"
		) </dev/null >/dev/null 2>&1 &
		printf %s $! >"$pidfile"
		exit 0
	fi ;;
esac
exec ` + shellQuote(c.runsc) + ` --platform=ptrace --network=none --root ` + shellQuote(c.RunscRoot) + ` "$@"
`
}
