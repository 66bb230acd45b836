package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// childEnv is set to "1" in the environment of a workload child that
// StartChild starts.
const childEnv = "SANDBOXSTATS_TEST_CHILD"

// RunChild is the body of a package's helper "test" that StartChild
// re-executes the test binary to run, e.g.
//
//	func TestHelperChild(t *testing.T) { testenv.RunChild(t) }
//
// Run normally (childEnv unset) it skips. As the child it obeys one command
// per stdin line, answers one line and exits when stdin closes:
//
//	alloc <MiB>  allocate and touch that much memory  -> "ok <allocations held>"
//	free         drop it and return it to the kernel  -> "ok"
//	burn <ms>    spin until this process used <ms> more CPU -> "ok <usec used>"
func RunChild(t *testing.T) {
	if !InChild() {
		t.Skip("helper process: the workload child testenv.StartChild starts")
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
			fmt.Println("ok", len(hold))
		case "free":
			hold = nil
			debug.FreeOSMemory()
			fmt.Println("ok")
		case "burn":
			start := selfCPUUsec()
			x := 0
			for selfCPUUsec()-start < int64(n)*1000 {
				for i := range 100000 {
					x += i
				}
			}
			fmt.Println("ok", selfCPUUsec()-start, x%2)
		default:
			fmt.Println("unknown command", cmd)
		}
	}
	os.Exit(0)
}

// InChild reports whether this process is a child StartChild (or
// WorkerPod.StartChild) started, for a helper test that answers commands of
// its own.
func InChild() bool { return os.Getenv(childEnv) == "1" }

func selfCPUUsec() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano()/1000 + ru.Stime.Nano()/1000
}

// Child is a running workload child (see RunChild).
type Child struct {
	Cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

// StartChild re-executes the test binary to run only the helper test named
// helper (whose body is RunChild) with childEnv=1. The test's cleanup kills
// the child; register cgroups it will join before starting it, so that their
// removal runs after.
func StartChild(t testing.TB, helper string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	return startChild(t, cmd)
}

// startChild starts cmd with pipes on its stdin and stdout, its stderr the
// test's, and kills it in the test's cleanup.
func startChild(t testing.TB, cmd *exec.Cmd) *Child {
	t.Helper()
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
	c := &Child{Cmd: cmd, in: inW, out: bufio.NewScanner(outR)}
	t.Cleanup(func() { c.Kill(); outR.Close() })
	return c
}

// Do sends one command and returns the child's answer, failing the test
// unless it starts with "ok".
func (c *Child) Do(t testing.TB, line string) string {
	t.Helper()
	c.Send(t, line)
	return c.Answer(t, line)
}

// Answer reads the answer to a command sent with Send, failing the test
// unless it starts with "ok".
func (c *Child) Answer(t testing.TB, line string) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("child %q: no answer: %v", line, c.out.Err())
	}
	ans := c.out.Text()
	if !strings.HasPrefix(ans, "ok") {
		t.Fatalf("child %q: %q", line, ans)
	}
	return ans
}

// Ask sends one command and returns the child's answer, whatever it is.
func (c *Child) Ask(t testing.TB, line string) string {
	t.Helper()
	c.Send(t, line)
	if !c.out.Scan() {
		t.Fatalf("child %q: no answer: %v", line, c.out.Err())
	}
	return c.out.Text()
}

// Send sends one command without waiting for its answer (read it with
// Answer), for commands run side by side or one the child may not survive
// (an allocation past its cgroup's memory limit).
func (c *Child) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatalf("child %q: %v", line, err)
	}
}

// Wait waits for the child to exit and returns how it ended.
func (c *Child) Wait() (*os.ProcessState, error) {
	err := c.Cmd.Wait()
	return c.Cmd.ProcessState, err
}

// Kill closes the child's stdin, kills it and waits for it; a second call
// does nothing.
func (c *Child) Kill() {
	if c.Cmd.ProcessState != nil {
		return
	}
	c.in.Close()
	_ = c.Cmd.Process.Kill()
	_ = c.Cmd.Wait()
}

// Favor gives every thread of the child the highest CFS priority (nice -20;
// root only), so a busy loop in it runs whenever it is runnable even while
// other tests load the machine: a test that measures what a CFS quota did
// to the loop (throttled time against wall time) is then not measuring the
// time it waited for a CPU. Threads the child makes later inherit it from
// the thread that makes them.
func (c *Child) Favor(t testing.TB) {
	t.Helper()
	setNice(t, c.Cmd.Process.Pid, -20)
}

// FavorProcess is Child.Favor for any process (a daemon under test, or the
// test binary itself, os.Getpid()) and returns a function that gives its
// threads, those made meanwhile too, the nice the process had back. A test
// measuring latencies favors both ends of the calls, so that it measures
// them and not the waits the machine's other tenants impose.
func FavorProcess(t testing.TB, pid int) (restore func()) {
	t.Helper()
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, pid)
	if err != nil {
		t.Fatalf("getpriority %d: %v", pid, err)
	}
	was := 20 - raw // the raw syscall answers 20 - nice
	setNice(t, pid, -20)
	return func() { setNice(t, pid, was) }
}

// setNice sets the nice of every thread of pid; a thread that exited
// meanwhile is skipped.
func setNice(t testing.TB, pid, nice int) {
	t.Helper()
	for _, tid := range threads(t, pid) {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("setpriority thread %d of %d: %v", tid, pid, err)
		}
	}
}

// threads lists the threads of pid (scheduling attributes such as nice and
// the CPU mask are per thread: a Go process runs several, any of which may
// run its busy loop).
func threads(t testing.TB, pid int) []int {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var tids []int
	for _, task := range tasks {
		if tid, err := strconv.Atoi(task.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids
}
