package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// peerHelperEnv names the socket the helper process dials.
const peerHelperEnv = "SANDBOXSTATS_PEER_HELPER_SOCKET"

// TestPeerHelper is not a test: re-executed as another user by dialAs, it
// dials the socket in peerHelperEnv, asks for its health and prints "ok" or
// "refused: <error>".
func TestPeerHelper(t *testing.T) {
	sock := os.Getenv(peerHelperEnv)
	if sock == "" {
		t.Skip("helper process: dials a statsd socket as another user (see dialAs)")
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		cc.Close()
	}
	if err != nil {
		fmt.Println("refused:", err)
	} else {
		fmt.Println("ok")
	}
	os.Exit(0)
}

// openDir makes a directory every user may traverse (the sockets must be
// reachable by the helper), removed at the end of the test.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sandboxstats-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// dialAs runs TestPeerHelper as uid:gid (a copy of the test binary that the
// user may execute) against sock and returns its one line of output.
func dialAs(t *testing.T, exe string, uid, gid uint32, sock string) string {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^TestPeerHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), peerHelperEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as %d:%d: %v\n%s", uid, gid, err, out)
	}
	line := strings.TrimSpace(string(out))
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	return line
}

// helperBinary copies the test binary where uid 65534 may run it.
func helperBinary(t *testing.T, dir string) string {
	t.Helper()
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exe := filepath.Join(dir, "peer-helper.test")
	dst, err := os.OpenFile(exe, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestIntegrationPeerCredentials: file modes alone decide nothing. With both
// sockets chmod 0666, a process running as nobody is refused on both (closed
// before any byte is served, counted, logged), root is served; with
// --socket-group nogroup the read socket's group (and so its allowlist) is
// nogroup, which admits nobody there and nowhere else.
func TestIntegrationPeerCredentials(t *testing.T) {
	testenv.Need(t, os.Geteuid() == 0, "needs root to run a helper as nobody")
	if testing.Short() {
		t.Skip("runs the statsd binary")
	}
	bin := testenv.BuildBinaries(t)
	for _, tc := range []struct {
		name       string
		args       []string
		wantGID    int
		nobodyRead string // "ok" or "refused"
	}{
		{"default allowlists", nil, 0, "refused"},
		{"--socket-group nogroup", []string{"--socket-group", "nogroup"}, 65534, "ok"},
		{"--read-allow-uids 65534", []string{"--read-allow-uids", "0,65534"}, 0, "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := openDir(t)
			exe := helperBinary(t, dir)
			d := testenv.StartStatsdAt(t, bin, filepath.Join(dir, "stats", "statsd.sock"), filepath.Join(dir, "life", "statsd.sock"),
				filepath.Join(dir, "state"), append([]string{"--drift-interval", "0"}, tc.args...)...)
			for _, p := range []string{d.Stats, d.Lifecycle, filepath.Dir(d.Stats), filepath.Dir(d.Lifecycle)} {
				mode := os.FileMode(0o666)
				if fi, err := os.Stat(p); err == nil && fi.IsDir() {
					mode = 0o755
				}
				if err := os.Chmod(p, mode); err != nil {
					t.Fatal(err)
				}
			}
			if fi, err := os.Stat(d.Stats); err != nil || int(fi.Sys().(*syscall.Stat_t).Gid) != tc.wantGID {
				t.Errorf("read socket group: %v, want gid %d", fi.Sys().(*syscall.Stat_t).Gid, tc.wantGID)
			}
			if got := dialAs(t, exe, 0, 0, d.Stats); got != "ok" {
				t.Errorf("root on the read socket: %s", got)
			}
			if got := dialAs(t, exe, 0, 0, d.Lifecycle); got != "ok" {
				t.Errorf("root on the lifecycle socket: %s", got)
			}
			if got := dialAs(t, exe, 65534, 65534, d.Stats); !strings.HasPrefix(got, tc.nobodyRead) {
				t.Errorf("nobody on the read socket (mode 0666): %s, want %s", got, tc.nobodyRead)
			}
			if got := dialAs(t, exe, 65534, 65534, d.Lifecycle); !strings.HasPrefix(got, "refused") {
				t.Errorf("nobody on the lifecycle socket (mode 0666): %s, want refused", got)
			}
			time.Sleep(100 * time.Millisecond)
			logs, _ := os.ReadFile(d.Log)
			if !strings.Contains(string(logs), "peer refused") || !strings.Contains(string(logs), "uid=65534") {
				t.Errorf("no refusal logged:\n%s", logs)
			}
			for line := range strings.Lines(string(logs)) {
				if strings.Contains(line, "peer refused") {
					t.Logf("logged: %s", strings.TrimSpace(line))
				}
			}
		})
	}
}
