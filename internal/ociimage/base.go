package ociimage

import "archive/tar"

// The base layer's users and groups: root, the nonroot user (65532, as in
// distroless) and the sandboxstats group of the stats sockets
// (deploy/systemd/sandboxstats.sysusers.conf: 2375). No user is a member
// of sandboxstats here: a pod joins it with supplementalGroups.
const (
	NonrootUID        = 65532
	SandboxstatsGroup = 2375
)

const (
	etcPasswd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	etcGroup = "root:x:0:\n" +
		"sandboxstats:x:2375:\n" +
		"nonroot:x:65532:\n"
	// nsswitch.conf: Go's resolver reads hosts from /etc/hosts first.
	etcNsswitch = "hosts: files dns\n"
)

// BaseLayer is the layer every project image starts from, what a static Go
// binary needs: /etc/passwd and /etc/group (root, nonroot, sandboxstats),
// /etc/nsswitch.conf, a sticky /tmp, the home directories. No CA bundle (the
// Collector links golang.org/x/crypto/x509roots/fallback; a private CA is a
// mounted file: deploy/README.md, "Images").
func BaseLayer() []Entry {
	home := Dir("home/nonroot", 0o700)
	home.UID, home.GID = NonrootUID, NonrootUID
	return []Entry{
		Dir("etc", 0o755),
		File("etc/group", 0o644, []byte(etcGroup)),
		File("etc/nsswitch.conf", 0o644, []byte(etcNsswitch)),
		File("etc/passwd", 0o644, []byte(etcPasswd)),
		Dir("home", 0o755),
		home,
		Dir("root", 0o700),
		{Name: "tmp", Type: tar.TypeDir, Mode: 0o1777},
	}
}
