package gvisor

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

const childEnv = "SANDBOXSTATS_GVISOR_TEST_CHILD"

// TestHelperChild is not a test: it is the workload process the real-cgroup
// test moves into its cgroups (the test binary re-executed with childEnv).
// It obeys one command per stdin line and answers one line:
//
//	alloc <MiB>  allocate and touch that much memory  -> "ok"
//	free         drop it and return it to the kernel  -> "ok"
//	burn <ms>    spin until this process used <ms> more CPU -> "ok <usec used>"
func TestHelperChild(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper process for TestIntegrationRealCgroup")
	}
	var hold [][]byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		n, _ := strconv.Atoi(arg)
		switch cmd {
		case "alloc":
			b := make([]byte, n<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			hold = append(hold, b)
			fmt.Println("ok")
		case "free":
			hold = nil
			debug.FreeOSMemory()
			fmt.Println("ok")
		case "burn":
			start := cpuUsec()
			x := 0
			for cpuUsec()-start < int64(n)*1000 {
				for i := range 100000 {
					x += i
				}
			}
			fmt.Println("ok", cpuUsec()-start, x%2)
		default:
			fmt.Println("unknown command", cmd)
		}
	}
	os.Exit(0)
}

func cpuUsec() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Sec*1e6 + ru.Utime.Usec + ru.Stime.Sec*1e6 + ru.Stime.Usec
}

// child is a running TestHelperChild.
type child struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

func startChild(t *testing.T) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	c := &child{cmd: cmd, in: inW, out: bufio.NewScanner(outR)}
	t.Cleanup(func() { c.kill(); outR.Close() })
	return c
}

func (c *child) do(t *testing.T, line string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatalf("child %q: %v", line, err)
	}
	if !c.out.Scan() {
		t.Fatalf("child %q: no answer: %v", line, c.out.Err())
	}
	ans := c.out.Text()
	if !strings.HasPrefix(ans, "ok") {
		t.Fatalf("child %q: %q", line, ans)
	}
	return ans
}

func (c *child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	c.in.Close()
	c.cmd.Process.Kill()
	c.cmd.Wait()
}

// mkCgroup makes dir and removes it at the end of the test.
func mkCgroup(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testenv.RmdirRetry(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func join(t *testing.T, dir string, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move pid %d into %s: %v", pid, dir, err)
	}
}
