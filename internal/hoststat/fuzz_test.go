package hoststat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Seeds run as unit tests under go test; go test -fuzz explores further.

func FuzzClassifyThread(f *testing.F) {
	for _, s := range []string{"CPU 0/KVM", "vcpu3", "fc_vcpu 1", "CPU /KVM", "vcpu", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		_, idx, isVCPU := classifyThread(name)
		if !isVCPU && idx != 0 || idx < 0 {
			t.Errorf("classifyThread(%q) idx %d vcpu %v", name, idx, isVCPU)
		}
	})
}

func FuzzParseQEMUGuestName(f *testing.F) {
	for _, s := range []string{"qemu\x00-name\x00guest=srv1,debug-threads=on\x00", "qemu\x00-name\x00a,,b\x00", "", "\x00\x00-name"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := parseQEMUGuestName(b); n != "" && usableName(n) == "" {
			t.Errorf("unusable name %q returned", n)
		}
	})
}

func FuzzParseDebugfs(f *testing.F) {
	for _, s := range []string{"1234\n", "18446744073709551615\n", "-1\n", "", "112-5", "4242-11"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		parseDebugfsValue(b)
		if pid, _, ok := parseVMDirName(string(b)); ok && pid <= 0 {
			t.Errorf("parseVMDirName(%q) accepted pid %d", b, pid)
		}
	})
}

func FuzzParseQMP(f *testing.F) {
	for _, name := range []string{"query-stats-vcpu", "query-stats-vm", "query-stats-schemas", "query-cpus-fast"} {
		b, err := os.ReadFile(filepath.Join("testdata", "qmp", name+".json"))
		if err != nil {
			f.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(m["return"]))
	}
	f.Add([]byte(`[{"provider":"kvm","stats":[{"name":"x","value":-1}]}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		schemas, _ := parseQMPSchemas(b)
		cpus, _ := parseQMPCPUs(b)
		for _, target := range []string{"vm", "vcpu"} {
			cs, err := parseQMPStats(b, target, schemas, cpus)
			if err == nil {
				for _, c := range cs {
					if c.Kind == 0 {
						t.Errorf("counter %q without a kind", c.Name)
					}
				}
			}
		}
	})
}

// FuzzRunnerKernel runs /proc/stat text through the parser and the usec
// conversion.
func FuzzRunnerKernel(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "proc", "stat"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4\n"))
	f.Add([]byte("cpu  -1 x\n"))
	// One directory for the worker's inputs, rewritten for each (inputs run
	// one at a time in a worker): a directory per input made the target
	// slow enough to trip the fuzz coordinator's deadline.
	root := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(root, "stat"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := newSampler(sourceRefNone, Config{ProcRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		v := s.runnerKernel(t.Context())
		if v.Error == "" && v.Total == nil {
			t.Error("no error and no total")
		}
	})
}
