package nribridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// Kata's Go runtime (containerd-shim-kata-v2) lays a sandbox out under its
// run directory, /run/vc (src/runtime/virtcontainers: persist/fs, clh.go,
// fc.go, hypervisor.go):
//
//	sbs/<id>/persist.json                  the sandbox's state: "AgentState": {"URL": ...},
//	                                        "HypervisorState": {"Type": ..., "Pid": ...}
//	vm/<id>/clh.sock                       Cloud Hypervisor's hybrid-vsock socket
//	firecracker/<id>/root/kata.hvsock      Firecracker's (in the jailer's root)
//
// QEMU uses real vsock: its agent URL is vsock://<cid>:1024, with the CID
// Kata claimed, found only in persist.json. The agent listens on port 1024.
const (
	// DefaultKataRoot is the Go runtime's run directory.
	DefaultKataRoot = "/run/vc"
	kataAgentPort   = 1024
	// maxPersistBytes bounds persist.json (a few KiB in practice; the
	// device and network state make it grow with the sandbox).
	maxPersistBytes = 1 << 20
)

// ErrKataNotYet means the sandbox's layout is not (yet) there: the pod may
// have started before Kata wrote it, so the bridge tries again later.
var ErrKataNotYet = errors.New("nribridge: kata sandbox layout not found")

// KataLayout reads Kata's per-sandbox layout under Root (DefaultKataRoot;
// mounted at the same path as on the host, since the addresses it yields
// are the host's).
type KataLayout struct {
	Root string
}

// persisted is what the bridge reads of persist.json (Kata's
// persistapi.SandboxState: Go field names, no JSON tags).
type persisted struct {
	State           string
	HypervisorState struct {
		Type string
		Pid  int
	}
	AgentState struct {
		URL string
	}
}

// Resolve finds the agent address and VMM pid of sandbox id: from
// persist.json when it is there, else from the hybrid-vsock socket of
// Cloud Hypervisor or Firecracker (no VMM pid then). Neither there:
// ErrKataNotYet. An address Kata wrote that statsd cannot take (a
// remote:// or mock:// agent) is Unmappable.
func (l KataLayout) Resolve(id string) (Kata, error) {
	if err := validContainerID(id); err != nil || id == "." || id == ".." || strings.Contains(id, "/") {
		return Kata{}, unmappable("invalid-sandbox-id", "kata sandbox id %s cannot name a directory", foreign.Quote(id))
	}
	root := l.Root
	if root == "" {
		root = DefaultKataRoot
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Kata{}, fmt.Errorf("%w: %s: %w", ErrKataNotYet, root, err)
		}
		return Kata{}, fmt.Errorf("kata root %s: %w", root, err)
	}
	defer r.Close()

	persistPath := path.Join("sbs", id, "persist.json")
	b, err := readRegular(r, persistPath, maxPersistBytes)
	switch {
	case err == nil:
		return fromPersisted(filepath.Join(root, persistPath), b)
	case !errors.Is(err, fs.ErrNotExist):
		return Kata{}, fmt.Errorf("kata %s: %w", filepath.Join(root, persistPath), err)
	}
	for _, s := range []struct{ hypervisor, rel string }{
		{"clh", path.Join("vm", id, "clh.sock")},
		{"firecracker", path.Join("firecracker", id, "root", "kata.hvsock")},
	} {
		fi, err := r.Stat(s.rel)
		if err == nil && fi.Mode().Type() == fs.ModeSocket {
			return Kata{Hypervisor: s.hypervisor, AgentAddress: hvsock(filepath.Join(root, s.rel), kataAgentPort)}, nil
		}
	}
	return Kata{}, fmt.Errorf("%w: no %s, %s or %s under %s", ErrKataNotYet, persistPath,
		path.Join("vm", id, "clh.sock"), path.Join("firecracker", id, "root", "kata.hvsock"), root)
}

// fromPersisted reads the agent URL and the VMM pid out of persist.json.
func fromPersisted(file string, b []byte) (Kata, error) {
	var p persisted
	if err := json.Unmarshal(b, &p); err != nil {
		// Empty, or cut short at its end: Kata is writing it (it does not
		// write it by a rename); not yet, tried again, rather than
		// unactionable until the next listing.
		var se *json.SyntaxError
		if len(bytes.TrimSpace(b)) == 0 || errors.As(err, &se) && se.Error() == "unexpected end of JSON input" {
			return Kata{}, fmt.Errorf("%w: %s being written (%d bytes): %w", ErrKataNotYet, file, len(b), err)
		}
		return Kata{}, unmappable("kata-persist", "kata %s: %w", file, err)
	}
	addr, err := agentAddress(p.AgentState.URL)
	if err != nil {
		return Kata{}, unmappable("kata-agent-url", "kata %s: AgentState.URL: %w", file, err)
	}
	k := Kata{AgentAddress: addr, Hypervisor: foreign.ASCII(p.HypervisorState.Type, 32)}
	if p.HypervisorState.Pid > 0 && p.HypervisorState.Pid <= 1<<31-1 {
		k.VMMPID = p.HypervisorState.Pid
	}
	return k, nil
}

// agentAddress turns the URL Kata's Go runtime wrote into what statsd
// takes: hvsock://<absolute path>:<port> as it is (a missing port is
// Kata's 1024, as runtime-rs writes it), vsock://<cid>:<port> as it is.
// statsd validates the result again; this refuses what it would refuse
// anyway, naming the URL.
func agentAddress(url string) (string, error) {
	scheme, rest, ok := strings.Cut(url, "://")
	switch {
	case url == "":
		return "", errors.New("empty")
	case len(url) > maxPathBytes || strings.IndexFunc(url, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "", fmt.Errorf("%s is too long or has a control character", foreign.Quote(url))
	case !ok:
		return "", fmt.Errorf("%s has no scheme", foreign.Quote(url))
	case scheme == "hvsock":
		p, port := rest, ""
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			p, port = rest[:i], rest[i+1:]
		}
		if port == "" {
			port = strconv.Itoa(kataAgentPort)
		}
		if n, err := strconv.ParseUint(port, 10, 32); err != nil || n == 0 {
			return "", fmt.Errorf("%s: port %s", foreign.Quote(url), foreign.Quote(port))
		}
		if !path.IsAbs(p) || path.Clean(p) != p {
			return "", fmt.Errorf("%s: the socket path is not absolute and clean", foreign.Quote(url))
		}
		return hvsock(p, mustAtoi(port)), nil
	case scheme == "vsock":
		cid, port, ok := strings.Cut(rest, ":")
		c, err1 := strconv.ParseUint(cid, 10, 32)
		n, err2 := strconv.ParseUint(port, 10, 32)
		if !ok || err1 != nil || err2 != nil || c < 3 || n == 0 {
			return "", fmt.Errorf("%s: want vsock://<cid>=3..:<port>", foreign.Quote(url))
		}
		return fmt.Sprintf("vsock://%d:%d", c, n), nil
	default:
		return "", fmt.Errorf("%s: scheme %s is not one statsd dials (hvsock, vsock)", foreign.Quote(url), foreign.Quote(scheme))
	}
}

func hvsock(p string, port int) string { return fmt.Sprintf("hvsock://%s:%d", p, port) }

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// readRegular reads name under r: a regular file of at most max bytes,
// opened without blocking (a FIFO in its place is refused, not waited on).
func readRegular(r *os.Root, name string, max int64) ([]byte, error) {
	f, err := r.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %s, not a regular file", name, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, max)
	}
	return b, nil
}
