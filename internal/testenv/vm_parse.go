package testenv

// The VM lane's serial console: what the guest's tests said, how it ended.

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"time"
)

// vmParser follows the guest's serial output.
type vmParser struct {
	mu       sync.Mutex
	results  map[string]*VMResult // "<run>/<test>"
	run      string               // the run in progress
	test     *VMResult            // the top-level test in progress
	last     []string             // the last serial lines
	exits    map[string]string    // a run's exit status, by run
	done     bool                 // SBSVM-DONE seen
	panicked bool
}

func newVMParser(runs []VMRun) *vmParser {
	p := &vmParser{results: map[string]*VMResult{}}
	for _, r := range runs {
		for _, n := range r.Tests {
			p.results[r.Name+"/"+n] = &VMResult{}
		}
	}
	return p
}

var (
	vmRunLine  = regexp.MustCompile(`^=== RUN\s+([^/\s]+)$`)
	vmDoneLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): ([^/\s]+) (\(.*\))$`)
)

const vmTailLines = 40

// consume reads serial lines until EOF; onPanic is called once, when the
// guest's kernel panics.
func (p *vmParser) consume(r io.Reader, onPanic func()) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		p.mu.Lock()
		p.last = append(p.last, line)
		if len(p.last) > vmTailLines {
			p.last = p.last[len(p.last)-vmTailLines:]
		}
		panicked := !p.panicked && strings.Contains(line, "Kernel panic")
		if panicked {
			p.panicked = true
		}
		p.line(line)
		p.mu.Unlock()
		if panicked {
			onPanic()
		}
	}
	if err := sc.Err(); err != nil {
		// A line over the scanner's 1 MiB: say so, and keep draining, or
		// QEMU blocks writing the console and the guest stalls.
		p.mu.Lock()
		p.last = append(p.last, fmt.Sprintf("(testenv: serial output unreadable from here on: %v)", err))
		p.mu.Unlock()
		_, _ = io.Copy(io.Discard, r)
	}
}

func (p *vmParser) line(line string) {
	if f := strings.Fields(line); len(f) >= 2 && f[0] == "SBSVM-BEGIN" {
		p.run, p.test = f[1], nil
		return
	}
	if f := strings.Fields(line); len(f) == 3 && f[0] == "SBSVM-END" {
		if p.exits == nil {
			p.exits = map[string]string{}
		}
		p.exits[f[1]] = f[2]
		p.run, p.test = "", nil
		return
	}
	if line == "SBSVM-DONE" {
		p.done = true
		return
	}
	if p.run == "" {
		return
	}
	if m := vmRunLine.FindStringSubmatch(line); m != nil {
		p.test = p.results[p.run+"/"+m[1]]
		if p.test != nil {
			p.test.Out = append(p.test.Out, line)
		}
		return
	}
	if m := vmDoneLine.FindStringSubmatch(line); m != nil {
		if res := p.results[p.run+"/"+m[2]]; res != nil {
			if res != p.test {
				res.Out = append(res.Out, line)
			}
			res.Status, res.Dur = m[1], m[3]
		}
		if p.test != nil {
			p.test.Out = append(p.test.Out, line)
		}
		p.test = nil
		return
	}
	if p.test != nil && len(p.test.Out) < 2000 {
		p.test.Out = append(p.test.Out, line)
	}
}

func (p *vmParser) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.last, "\n")
}

// why says how the guest ended.
func (p *vmParser) why(timedOut bool, limit time.Duration, werr error, stderr string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.panicked:
		return "the guest kernel panicked"
	case timedOut:
		return fmt.Sprintf("killed at the %v deadline", limit)
	case !p.done:
		return fmt.Sprintf("QEMU exited before the guest was done: %v %s", werr, strings.TrimSpace(stderr))
	}
	return "done"
}
