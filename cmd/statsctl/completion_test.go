package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"completion", shell}, &out, &errOut); code != 0 {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errOut.String())
	}
	return out.String()
}

// needShell finds a shell for a syntax or behaviour check: skipped when
// missing, a failure under CI=true (.ci/run installs zsh and fish).
func needShell(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (apt-get install %s)", name, name)
		}
		t.Skipf("%s is not installed (apt-get install %s)", name, name)
	}
	return p
}

// TestCompletionScripts: each script parses in its shell (bash -n, zsh -n,
// fish -n) and names every command of the table and every flag of every
// command.
func TestCompletionScripts(t *testing.T) {
	specs := commandSpecs()
	for _, c := range commands {
		if !slices.ContainsFunc(specs, func(s cmdSpec) bool { return s.name == c.name }) {
			t.Errorf("no completion spec for %s", c.name)
		}
	}
	if i := slices.IndexFunc(specs, func(s cmdSpec) bool { return s.name == "stats" }); i < 0 || len(specs[i].flags) < 5 {
		t.Fatalf("stats' flags were not read from its flag set: %+v", specs)
	}
	for _, shell := range shells {
		t.Run(shell, func(t *testing.T) {
			script := completionScript(t, shell)
			for _, s := range specs {
				if !strings.Contains(script, s.name) {
					t.Errorf("%s script lacks the command %s", shell, s.name)
				}
				for _, f := range s.flags {
					name := f.dash()
					if shell == "fish" {
						name = map[bool]string{true: "-s ", false: "-l "}[len(f.name) == 1] + f.name
					}
					if !strings.Contains(script, name) {
						t.Errorf("%s script lacks %s of %s", shell, name, s.name)
					}
				}
			}
			p := filepath.Join(t.TempDir(), "statsctl."+shell)
			if err := os.WriteFile(p, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(needShell(t, shell), "-n", p).CombinedOutput(); err != nil || len(out) > 0 {
				t.Errorf("%s -n: %v\n%s", shell, err, out)
			}
		})
	}
}

// TestCompletionBash runs the bash script's function on command lines as
// bash would hand them over and checks what it offers.
func TestCompletionBash(t *testing.T) {
	bash := needShell(t, "bash")
	p := filepath.Join(t.TempDir(), "statsctl.bash")
	if err := os.WriteFile(p, []byte(completionScript(t, "bash")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line string // the words; the last is the one completed
		want string
	}{
		{"statsctl st", "stats"},
		{"statsctl he", "health help"},
		{"statsctl --socket /run/x.sock he", "health help"},
		{"statsctl --timeout 5s --lif", "--lifecycle-socket"},
		{"statsctl run-workload --cl", "--class"},
		{"statsctl run-workload --class ", "gvisor microvm"},
		{"statsctl stats -o ", "table json"},
		{"statsctl stats --actor-uid ", ""},
		{"statsctl poll --so", "--sockets"},
		{"statsctl completion ", "bash zsh fish --help"},
		{"statsctl help ch", "checkpoint-workload"},
		{"statsctl version -", "-o --help"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			words := strings.Split(tc.line, " ")
			var quoted []string
			for _, w := range words {
				quoted = append(quoted, "'"+w+"'")
			}
			script := "source " + p + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
				strconv.Itoa(len(words)-1) + "\n_statsctl\necho \"${COMPREPLY[*]}\"\n"
			out, err := exec.Command(bash, "-c", script).CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got := strings.TrimSpace(string(out)); got != tc.want {
				t.Errorf("%q completes to %q, want %q", tc.line, got, tc.want)
			}
		})
	}
}

// TestCompletionFish asks fish itself (complete -C) what the script offers.
func TestCompletionFish(t *testing.T) {
	fish := needShell(t, "fish")
	p := filepath.Join(t.TempDir(), "statsctl.fish")
	if err := os.WriteFile(p, []byte(completionScript(t, "fish")), 0o644); err != nil {
		t.Fatal(err)
	}
	for line, want := range map[string][]string{
		"statsctl st":                    {"stats"},
		"statsctl run-workload --cla":    {"--class"},
		"statsctl run-workload --class ": {"gvisor", "microvm"},
		"statsctl completion ":           {"bash", "fish", "zsh"},
	} {
		out, err := exec.Command(fish, "--no-config", "-c", "source "+p+"; complete -C '"+line+"'").CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", line, err, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			got = append(got, strings.SplitN(l, "\t", 2)[0])
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%q completes to %q, want %q", line, got, want)
		}
	}
}
