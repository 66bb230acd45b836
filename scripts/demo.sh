#!/bin/sh
# demo.sh: the main job on a fresh machine. Run as root after `make build`.
#
# Starts a real gVisor sandbox (runsc, ptrace platform, no network) whose
# busybox workload writes and removes 64 MiB in /dev/shm in a loop, starts
# bin/statsd on Unix sockets in a temporary directory, binds the sandbox with
# `bin/statsctl run-workload --sentry-pid <pid>` (the class, gvisor, follows
# from the flag), and prints `bin/statsctl stats` a few times so the figures
# can be seen moving. It ends with the node view: one sweep as the node agent
# sees it (`statsctl poll`), then bin/statsagent polling the same statsd and
# the workload's lines of its Prometheus /metrics (read with curl, or with
# `busybox wget` where curl is not installed).
#
# Where runsc cannot run (not installed, no static busybox, the sandbox does
# not start), it says why and measures a plain cgroup workload instead: a
# shell loop in a v1 memory+cpuacct cgroup (or a v2 cgroup with the memory
# controller), bound with --cgroup-path.
#
# Everything it makes (sandbox, cgroups, statsd, temporary files) is removed
# on exit or Ctrl-C.
#
# Environment: SAMPLES (default 5), INTERVAL seconds between samples
# (default 2), DEMO_FALLBACK=1 to skip gVisor, BIN (default ./bin).
set -eu

SAMPLES=${SAMPLES:-5}
INTERVAL=${INTERVAL:-2}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin}
CGROOT=/sys/fs/cgroup
ACTOR=demo-actor
NAME=sbsdemo-$$

say() { printf '\n== %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (runsc and cgroups need it): sudo make demo"
[ -x "$BIN/statsd" ] && [ -x "$BIN/statsctl" ] || die "no $BIN/statsd or $BIN/statsctl: run make build first"

TMP=$(mktemp -d /tmp/sbsdemo.XXXXXX)
RUNSC_ROOT=$TMP/runsc
SANDBOX_ID=
STATSD_PID=
AGENT_PID=
LOOP_PID=
CGDIRS=

# rmdir_retry removes an empty cgroup directory; the kernel may answer EBUSY
# for a moment while the last process is reaped.
rmdir_retry() {
	i=0
	while [ -d "$1" ] && ! rmdir "$1" 2>/dev/null; do
		i=$((i + 1))
		[ $i -le 50 ] || { echo "demo: could not remove $1" >&2; return 1; }
		sleep 0.1
	done
}

cleanup() {
	# A second Ctrl-C must not cut the cleanup short.
	trap '' INT TERM
	trap - EXIT
	set +e
	if [ -n "$AGENT_PID" ]; then
		kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
	fi
	if [ -n "$STATSD_PID" ]; then
		kill "$STATSD_PID" 2>/dev/null && wait "$STATSD_PID" 2>/dev/null
	fi
	if [ -n "$SANDBOX_ID" ]; then
		runsc --root "$RUNSC_ROOT" delete -force "$SANDBOX_ID" >/dev/null 2>&1
	fi
	if [ -n "$LOOP_PID" ]; then
		kill "$LOOP_PID" 2>/dev/null
		# The loop's current dd or sleep is still in the cgroup: kill every
		# process left there.
		for d in $CGDIRS; do
			[ -f "$d/cgroup.procs" ] && xargs -r kill -9 <"$d/cgroup.procs" 2>/dev/null
		done
		wait "$LOOP_PID" 2>/dev/null
	fi
	rm -rf "/dev/shm/$NAME"
	# runsc removes the leaf cgroups but leaves the parent in every v1
	# hierarchy; remove leaves first, then parents.
	for d in $CGDIRS "$CGROOT"/*/"$NAME"/pause "$CGROOT"/*/"$NAME" "$CGROOT/$NAME"; do
		[ -d "$d" ] && rmdir_retry "$d"
	done
	rm -rf "$TMP"
	echo
	echo "demo: cleaned up (sandbox, cgroups, statsd, statsagent, $TMP)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_gvisor starts the sandbox and sets SENTRY_PID; it prints why and
# returns 1 when gVisor cannot run here.
start_gvisor() {
	if [ "${DEMO_FALLBACK:-0}" = 1 ]; then
		echo "DEMO_FALLBACK=1: not trying gVisor"; return 1
	fi
	command -v runsc >/dev/null || { echo "runsc is not installed (apt-get install runsc)"; return 1; }
	bb=$(command -v busybox || true)
	if [ -z "$bb" ] || ldd "$bb" >/dev/null 2>&1; then
		echo "no static busybox for the sandbox's rootfs (apt-get install busybox-static)"; return 1
	fi
	bundle=$TMP/bundle
	mkdir -p "$bundle/rootfs/bin" "$bundle/rootfs/dev" "$bundle/rootfs/proc" "$bundle/rootfs/sys" "$bundle/rootfs/tmp" "$bundle/rootfs/etc"
	cp "$bb" "$bundle/rootfs/bin/busybox"
	for a in sh dd rm sleep; do ln -sf busybox "$bundle/rootfs/bin/$a"; done
	# The workload: 64 MiB into /dev/shm (gVisor's tmpfs, charged to the
	# sandbox cgroup as the sentry's memory), hold it, remove it, rest.
	(cd "$bundle" && runsc spec -- /bin/sh -c \
		'while true; do dd if=/dev/zero of=/dev/shm/blob bs=1M count=64 2>/dev/null; sleep 3; rm -f /dev/shm/blob; sleep 3; done')
	sed -i "s|\"linux\": {|\"linux\": {\n        \"cgroupsPath\": \"/$NAME/pause\",|" "$bundle/config.json"
	grep -q "\"cgroupsPath\": \"/$NAME/pause\"" "$bundle/config.json" || { echo "could not set cgroupsPath in the OCI spec"; return 1; }
	SANDBOX_ID=$NAME
	# runsc run -detach returns once the sandbox runs, a few seconds even on
	# a loaded machine: 30 s is ample and keeps a hung runsc within bounds.
	if ! (cd "$bundle" && timeout 30 runsc --root "$RUNSC_ROOT" --platform=ptrace --network=none \
		run -detach "$SANDBOX_ID" </dev/null >"$TMP/sandbox.out" 2>"$TMP/sandbox.err"); then
		echo "runsc could not start the sandbox here:"; sed 's/^/    /' "$TMP/sandbox.err" | tail -5
		runsc --root "$RUNSC_ROOT" delete -force "$SANDBOX_ID" >/dev/null 2>&1 || true
		SANDBOX_ID=; return 1
	fi
	SENTRY_PID=$(runsc --root "$RUNSC_ROOT" state "$SANDBOX_ID" </dev/null 2>/dev/null |
		sed -n 's/^ *"pid": *\([0-9][0-9]*\).*/\1/p' | head -n 1)
	[ -n "$SENTRY_PID" ] || { echo "runsc state did not give the sandbox pid"; return 1; }
	return 0
}

# start_cgroup_loop starts a shell loop in a fresh cgroup and sets CGPATH.
start_cgroup_loop() {
	if [ -d "$CGROOT/memory" ] && [ -d "$CGROOT/cpuacct" ]; then
		dirs="$CGROOT/memory/$NAME $CGROOT/cpuacct/$NAME"
	elif [ -f "$CGROOT/cgroup.controllers" ] && grep -qw memory "$CGROOT/cgroup.subtree_control" 2>/dev/null; then
		dirs="$CGROOT/$NAME"
	else
		die "no v1 memory+cpuacct hierarchies and no v2 memory controller enabled at $CGROOT: nothing to measure"
	fi
	for d in $dirs; do mkdir "$d"; CGDIRS="$d $CGDIRS"; done
	mkdir -p "/dev/shm/$NAME"
	# The loop joins the cgroup(s) itself, then writes and removes 64 MiB in
	# the host's /dev/shm (tmpfs pages are charged to its memory cgroup).
	DIRS="$dirs" SHM="/dev/shm/$NAME" sh -c '
		for d in $DIRS; do echo $$ > "$d/cgroup.procs"; done
		while true; do
			dd if=/dev/zero of="$SHM/blob" bs=1M count=64 2>/dev/null; sleep 3
			rm -f "$SHM/blob"; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 2
		done' </dev/null >/dev/null 2>&1 &
	LOOP_PID=$!
	CGPATH=/$NAME
}

say "starting the workload"
if start_gvisor; then
	CLASS_ARGS="--sentry-pid $SENTRY_PID"
	echo "gVisor sandbox $SANDBOX_ID runs (runsc --platform=ptrace --network=none); sentry pid $SENTRY_PID, cgroupsPath /$NAME/pause"
else
	echo "falling back to a plain cgroup workload (a shell loop, no gVisor)"
	start_cgroup_loop
	CLASS_ARGS="--cgroup-path $CGPATH"
	echo "shell loop pid $LOOP_PID in cgroup $CGPATH"
fi

# The stats socket in a directory of its own, the lifecycle socket in
# another: the node agent's glob must match stats sockets only.
STATS_SOCK=$TMP/stats/demo.sock
LIFECYCLE_SOCK=$TMP/lifecycle/demo.sock
say "starting statsd on sockets in $TMP"
"$BIN/statsd" --listen "$STATS_SOCK" --lifecycle-listen "unix://$LIFECYCLE_SOCK" --state-dir "$TMP/state" \
	--cgroup-root "$CGROOT" --proc-root /proc --read-timeout 2s >"$TMP/statsd.log" 2>&1 &
STATSD_PID=$!
i=0
while [ ! -S "$STATS_SOCK" ] || [ ! -S "$LIFECYCLE_SOCK" ]; do
	i=$((i + 1)); [ $i -le 100 ] || { cat "$TMP/statsd.log" >&2; die "statsd did not start"; }
	kill -0 "$STATSD_PID" 2>/dev/null || { cat "$TMP/statsd.log" >&2; die "statsd exited"; }
	sleep 0.1
done
echo "statsd pid $STATSD_PID"

say "binding: statsctl --lifecycle-socket ... run-workload $CLASS_ARGS (the class follows from the flag)"
# shellcheck disable=SC2086 # CLASS_ARGS is two words on purpose
"$BIN/statsctl" --lifecycle-socket "$LIFECYCLE_SOCK" run-workload --actor-uid "$ACTOR" \
	--actor-name demo --template-namespace demo --template-name busybox $CLASS_ARGS

n=1
while [ $n -le "$SAMPLES" ]; do
	say "sample $n/$SAMPLES: statsctl stats --actor-uid $ACTOR"
	"$BIN/statsctl" --socket "$STATS_SOCK" stats --actor-uid "$ACTOR" || true
	n=$((n + 1))
	if [ $n -le "$SAMPLES" ]; then sleep "$INTERVAL"; fi
done

say "the node view: statsctl poll --sockets '$TMP/stats/*.sock' (one sweep, as the node agent sees it)"
"$BIN/statsctl" poll --sockets "$TMP/stats/*.sock" --timeout 5s || true

[ -x "$BIN/statsagent" ] || { echo "no $BIN/statsagent: make build"; exit 0; }
# fetch URL prints a page of the agent within 5 s: with curl, else with
# busybox's wget (busybox-static is installed for the sandbox's rootfs).
# Debian's busybox wget has no -T (given it, 1.35 crashes): timeout bounds it.
if command -v curl >/dev/null; then
	FETCH="curl -fsS -m 5"
elif command -v busybox >/dev/null && busybox --list 2>/dev/null | grep -qx wget; then
	FETCH="timeout 5 busybox wget -qO-"
else
	echo "no curl and no busybox wget to read the agent's /metrics (apt-get install curl or busybox-static)"; exit 0
fi
# shellcheck disable=SC2086 # FETCH is a command and its options
fetch() { $FETCH "$1"; }
# start_agent starts statsagent in the background (AGENT_PID, ADDR) and
# waits for two sweeps: the first sight of a workload charges no CPU on a
# first start, the next one does.
start_agent() {
	: >"$TMP/statsagent.log"
	"$BIN/statsagent" --sockets "unix://$TMP/stats/*.sock" --interval 1s --min-interval 1s --timeout 500ms \
		--label-actor --state-dir "$TMP/agent-state" --metrics-listen 127.0.0.1:0 >"$TMP/statsagent.log" 2>&1 &
	AGENT_PID=$!
	ADDR=
	i=0
	while [ -z "$ADDR" ]; do
		i=$((i + 1)); [ $i -le 100 ] || { cat "$TMP/statsagent.log" >&2; die "statsagent did not start"; }
		ADDR=$(sed -n 's/.*msg="statsagent serving" addr=\([^ ]*\).*/\1/p' "$TMP/statsagent.log")
		sleep 0.1
	done
	i=0
	until fetch "http://$ADDR/metrics" 2>/dev/null | grep -Eq '^sandboxstats_agent_sweeps_total [2-9]'; do
		i=$((i + 1)); [ $i -le 100 ] || { cat "$TMP/statsagent.log" >&2; die "statsagent did not sweep"; }
		sleep 0.1
	done
}
# cpu_line prints the workload's CPU counter line of the agent's /metrics.
cpu_line() { fetch "http://$ADDR/metrics" | grep "^sandboxstats_workload_cpu_seconds_total{.*actor_uid=\"$ACTOR\""; }

say "the node agent: statsagent --sockets '$TMP/stats/*.sock' --interval 1s --state-dir $TMP/agent-state, and the workload's lines of its /metrics"
start_agent
echo "statsagent pid $AGENT_PID on http://$ADDR (/metrics, /healthz: $(fetch "http://$ADDR/healthz"))"
echo "\$ $FETCH http://$ADDR/metrics | grep 'actor_uid=\"$ACTOR\"'"
fetch "http://$ADDR/metrics" | grep "actor_uid=\"$ACTOR\""
echo "(sandboxstats_workload_cpu_seconds_total is a counter for rate(); on this first start the agent charges"
echo " the workload from its first sight on, so a fresh install is no spike: docs/statsagent.md, \"Restarts and delivery\")"

say "kill -9 the agent, wait 3 s, start it again: the counter continues from what it had charged, the CPU used while it was down included"
BEFORE=$(cpu_line)
kill -9 "$AGENT_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null || true # 137: the SIGKILL
AGENT_PID=
sleep 3
start_agent
echo "before the kill:    $BEFORE"
echo "after the restart:  $(cpu_line)"
grep -o 'msg="agent state restored[^"]*"' "$TMP/statsagent.log" | head -1
exit 0
