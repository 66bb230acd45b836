package main

// statsctl own-dir: hands a directory on the node to a non-root uid. The
// DaemonSet's init container runs it (deploy/kubernetes/daemonset.yaml):
// the kubelet makes a hostPath directory as root's, 0755, and the agent and
// the Collector (uid 65532) keep their state in one each. Nothing is
// prepared on the host by hand.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

func runOwnDir(_ context.Context, e *env, args []string) error {
	fs := flagSet(e, "own-dir", "Make each --dir a directory owned by --owner with --mode (made if missing; a symbolic link or another file type is refused), for a non-root process's state: a Kubernetes init container runs it as root with CAP_CHOWN over the hostPath directories the kubelet made")
	var (
		dirs  stringsFlag
		owner string
		mode  string
	)
	fs.Var(&dirs, "dir", "a `directory` (repeatable)")
	fs.StringVar(&owner, "owner", "", "`uid[:gid]` to own each directory (numeric; gid defaults to uid)")
	fs.StringVar(&mode, "mode", "0700", "permission bits, octal")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	uid, gid, err := parseOwner(owner)
	if err != nil {
		return usageError{err}
	}
	perm, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || perm&^0o777 != 0 {
		return usageError{fmt.Errorf("--mode %q: want octal permission bits such as 0700", mode)}
	}
	if len(dirs) == 0 {
		return usageError{errors.New("no --dir")}
	}
	for _, d := range dirs {
		if err := ownDir(d, uid, gid, uint32(perm)); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s: owner %d:%d mode %04o\n", safe(d), uid, gid, perm)
	}
	return nil
}

// parseOwner reads "uid" or "uid:gid", numeric.
func parseOwner(s string) (uid, gid int, err error) {
	u, g, hasGID := strings.Cut(s, ":")
	uid, err = strconv.Atoi(u)
	if err != nil || uid < 0 {
		return 0, 0, fmt.Errorf("--owner %q: want a numeric uid[:gid]", s)
	}
	gid = uid
	if hasGID {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return 0, 0, fmt.Errorf("--owner %q: want a numeric uid[:gid]", s)
		}
	}
	return uid, gid, nil
}
