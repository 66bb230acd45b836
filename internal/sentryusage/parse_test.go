package sentryusage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
)

// getFixtures returns the replies in testdata/replies by file name.
func getFixtures(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "replies", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = b
	}
	return out
}

func u64(v uint64) *uint64 { return &v }

// replyWith is a success reply whose result is result.
func replyWith(result string) []byte {
	return []byte(`{"success":true,"err":"","result":` + result + `}`)
}

func TestParseReply(t *testing.T) {
	fx := getFixtures(t)
	busy1 := Query{SandboxID: "sbx-exp1", ContainerID: "busy1"}
	cases := []struct {
		name  string
		reply []byte
		d     Dialect
		q     Query
		want  Usage
		err   error  // sentinel
		text  string // in the error
	}{
		{
			name: "release-20221219: every container's CPU, the sandbox's memory and pids", reply: fx["release-20221219-noarg.json"], d: DialectNoArg, q: busy1,
			want: Usage{Dialect: DialectNoArg, CPU: map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "sbx-exp1": 0},
				MemoryBytes: u64(6066176), Memory: MemorySandboxTotal, Pids: u64(3), PidsSandboxWide: true},
		},
		{
			name: "release-20221219 refuses a container id", reply: fx["release-20221219-refuses-id.json"], d: DialectContainerID, q: busy1,
			err: ErrRemote, text: `"json: cannot unmarshal string into Go value of type struct {}"`,
		},
		{
			name: "newer runsc: id echoed, memory split or own, pids the container's", reply: fx["head-shaped-containerid.json"], d: DialectContainerID, q: busy1,
			want: Usage{Dialect: DialectContainerID, CPU: map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "sbx-exp1": 0},
				MemoryBytes: u64(3033088), Memory: MemorySplitOrOwn, Pids: u64(2)},
		},
		{
			name: "release-2024 with a gVisor cpuacct cgroup: the container's total only", reply: fx["release-2024-cgroup-cpuacct.json"], d: DialectContainerID, q: busy1,
			want: Usage{Dialect: DialectContainerID, ContainerCPU: u64(4862213000), MemoryBytes: u64(1212416), Memory: MemorySplitOrOwn, Pids: u64(2)},
		},
		{
			name: "the pause container of a newer runsc: memory 0 omitted is absent", d: DialectContainerID, q: Query{SandboxID: "s", ContainerID: "s"},
			reply: replyWith(`{"event":{"type":"stats","id":"s","data":{"cpu":{"usage":{}},"memory":{"usage":{"limit":0,"failcnt":0}},"pids":{"current":1}}},"containerUsage":{"s":0,"a":5}}`),
			want:  Usage{Dialect: DialectContainerID, CPU: map[string]uint64{"s": 0, "a": 5}, Pids: u64(1)},
		},
		{
			name: "another container's reply", d: DialectContainerID, q: busy1,
			reply: replyWith(`{"event":{"type":"stats","id":"idle2","data":{}},"containerUsage":{"busy1":1}}`),
			err:   ErrWrongContainer, text: `event.id "idle2"`,
		},
		{
			name: "containers the caller does not know are left out and counted", d: DialectNoArg,
			q:     Query{SandboxID: "sbx-exp1", ContainerID: "busy1", Containers: []string{"sbx-exp1", "busy1", "idle2"}},
			reply: replyWith(`{"event":{"type":"stats","id":"","data":{}},"containerUsage":{"busy1":7,"other-pod-c":9,"x\u001b]0;pwned\u0007":1}}`),
			want:  Usage{Dialect: DialectNoArg, CPU: map[string]uint64{"busy1": 7}, Foreign: []string{"other-pod-c", "x\ufffd]0;pwned\ufffd"}, ForeignCount: 2},
		},
		{
			name: "a key runsc would refuse is foreign even with no known set", d: DialectNoArg, q: busy1,
			reply: replyWith(`{"event":{"type":"stats","id":"","data":{}},"containerUsage":{"../../etc":1,"busy1":2}}`),
			want:  Usage{Dialect: DialectNoArg, CPU: map[string]uint64{"busy1": 2}, Foreign: []string{"../../etc"}, ForeignCount: 1},
		},
		{
			name: "remote error text is escaped and cut", d: DialectContainerID, q: busy1,
			reply: []byte(`{"success":false,"err":"\u001b[2J` + strings.Repeat("A", 1000) + `","result":null}`),
			err:   ErrRemote, text: `"\x1b[2JAAAA`,
		},
		{name: "not JSON", reply: []byte("HTTP/1.1 400 Bad Request\r\n"), d: DialectNoArg, q: busy1, err: ErrMalformed, text: "not a urpc reply at byte 1"},
		{name: "no success", reply: []byte(`{"result":{}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `no "success"`},
		{name: "no event", reply: replyWith(`{"containerUsage":{}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `no "event"`},
		{name: "null result", reply: replyWith(`null`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `no "event"`},
		{name: "not a stats event", reply: replyWith(`{"event":{"type":"oom","data":{}}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `event type "oom"`},
		{name: "a negative CPU", reply: replyWith(`{"event":{"type":"stats","data":{}},"containerUsage":{"a":-1}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: "number -1"},
		{name: "a fractional memory", reply: replyWith(`{"event":{"type":"stats","data":{"memory":{"usage":{"usage":1.5}}}}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `at field "event.data.memory.usage.usage"`},
		{name: "a string for pids", reply: replyWith(`{"event":{"type":"stats","data":{"pids":{"current":"3"}}}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: "pids.current"},
		{name: "a string for the result's type", reply: replyWith(`{"event":{"type":7,"data":{}}}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `result is not an EventOut at field "event.type"`},
		{name: "a refusal whose result has another shape", reply: []byte(`{"success":false,"err":"no","result":{"event":[]}}`), d: DialectNoArg, q: busy1, err: ErrRemote, text: `"no"`},
		{name: "success a string", reply: []byte(`{"success":"yes","err":"","result":null}`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: `not a urpc reply at field "success"`},
		{name: "cut short", reply: replyWith(`{"event":{"type":"stats"`), d: DialectNoArg, q: busy1, err: ErrMalformed, text: "not a urpc reply"},
		{name: "bytes after the value", reply: append(replyWith(`{"event":{"type":"stats","data":{}}}`), `{}`...), d: DialectNoArg, q: busy1, err: ErrMalformed, text: "bytes after"},
		{
			name: "too many containers", d: DialectNoArg, q: busy1,
			reply: replyWith(`{"event":{"type":"stats","data":{}},"containerUsage":{` + manyKeys(MaxContainers+1) + `}}`),
			err:   ErrMalformed, text: "names 257 containers",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.reply == nil {
				t.Fatal("no reply (a missing fixture?)")
			}
			got, err := parseReply(tc.reply, tc.d, tc.q)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.text) {
					t.Fatalf("error %v, want %v containing %q", err, tc.err, tc.text)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"c` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i) + `":1`)
	}
	return b.String()
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestEncodeRequest(t *testing.T) {
	// The bytes runsc 20221219 wrote itself (strace of runsc events), and
	// the form newer runsc writes (Sandbox.Event passes &cid).
	for _, tc := range []struct {
		d    Dialect
		id   string
		want string
	}{
		{DialectNoArg, "busy1", `{"method":"containerManager.Event","arg":null}`},
		{DialectUnknown, "busy1", `{"method":"containerManager.Event","arg":null}`},
		{DialectContainerID, "busy1", `{"method":"containerManager.Event","arg":"busy1"}`},
		{DialectContainerID, `x","method":"containerManager.Destroy`, `{"method":"containerManager.Event","arg":"x\",\"method\":\"containerManager.Destroy"}`},
	} {
		if got := string(encodeRequest(tc.d, tc.id)); got != tc.want {
			t.Errorf("encodeRequest(%v, %q) = %s, want %s", tc.d, tc.id, got, tc.want)
		}
	}
}

// decodeRequest decodes a request as urpc's server does (serverCall),
// keeping every key, to check that only method and arg are there.
func decodeRequest(t testing.TB, b []byte) (method string, arg json.RawMessage) {
	t.Helper()
	method, arg, err := splitRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	return method, arg
}

// splitRequest is decodeRequest's work, for goroutines that may not call
// t.Fatal.
func splitRequest(b []byte) (method string, arg json.RawMessage, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return "", nil, fmt.Errorf("request %s: %w", b, err)
	}
	if len(m) != 2 {
		return "", nil, fmt.Errorf("request %s: %d keys, want method and arg", b, len(m))
	}
	if err := json.Unmarshal(m["method"], &method); err != nil {
		return "", nil, fmt.Errorf("request %s: method: %w", b, err)
	}
	return method, m["arg"], nil
}

// FuzzEncodeRequest: whatever the container id (Read refuses ids runsc
// would, but the encoder does not rely on it), a request is Method with one
// argument, the id or null.
func FuzzEncodeRequest(f *testing.F) {
	for _, s := range []string{"busy1", `","method":"containerManager.Destroy","x":"`, "\x00\xff", `\"}`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, id string, withID bool) {
		d := DialectNoArg
		if withID {
			d = DialectContainerID
		}
		method, arg := decodeRequest(t, encodeRequest(d, id))
		if method != Method {
			t.Fatalf("method %q", method)
		}
		if !withID {
			if string(arg) != "null" {
				t.Fatalf("arg %s, want null", arg)
			}
			return
		}
		var got string
		if err := json.Unmarshal(arg, &got); err != nil {
			t.Fatalf("arg %s: %v", arg, err)
		}
		if want := string([]rune(id)); got != want { // each invalid byte one U+FFFD, as encoding/json writes it
			t.Fatalf("arg %q, want %q", got, want)
		}
	})
}

// FuzzParseReply: no reply panics the parser, and what it accepts is
// carried clean: CPU keys are ids runsc would accept, foreign keys are cut
// and freed of control characters, the scopes agree with the dialect.
func FuzzParseReply(f *testing.F) {
	for _, b := range getFixtures(f) {
		f.Add(b, uint8(DialectNoArg))
		f.Add(b, uint8(DialectContainerID))
	}
	f.Add(replyWith(`{"event":{"type":"stats","id":"","data":{}},"containerUsage":{"../x":1,"busy1":18446744073709551615}}`), uint8(DialectNoArg))
	f.Add([]byte(`{"success":false,"err":"\u0000","result":null}`), uint8(DialectContainerID))
	f.Fuzz(func(t *testing.T, b []byte, dd uint8) {
		d := Dialect(dd % 3)
		q := Query{SandboxID: "sbx-exp1", ContainerID: "busy1"}
		got, err := parseReply(b, d, q)
		if err != nil {
			var re *replyError
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *replyError", err, err)
			}
			if len(err.Error()) > 4*foreign.MaxBytes+512 {
				t.Fatalf("error of %d bytes: not cut", len(err.Error()))
			}
			return
		}
		again, _ := parseReply(b, d, q)
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatalf("not deterministic (-first +second):\n%s", diff)
		}
		for k := range got.CPU {
			if validID(k) != nil {
				t.Fatalf("CPU key %q is not an id", k)
			}
		}
		if got.ForeignCount < len(got.Foreign) || len(got.Foreign) > maxForeignKept || len(got.CPU)+got.ForeignCount > MaxContainers {
			t.Fatalf("foreign %d of %d, CPU %d", len(got.Foreign), got.ForeignCount, len(got.CPU))
		}
		for _, k := range got.Foreign {
			if foreign.Text(k) != k || len(k) > foreign.MaxBytes+24 {
				t.Fatalf("foreign key %q not clean", k)
			}
		}
		if (got.MemoryBytes == nil) != (got.Memory == MemoryAbsent) || (got.Memory == MemorySandboxTotal) != (got.MemoryBytes != nil && d == DialectNoArg) {
			t.Fatalf("memory %v with scope %v in dialect %v", got.MemoryBytes, got.Memory, d)
		}
		if got.PidsSandboxWide && (got.Pids == nil || d != DialectNoArg) {
			t.Fatalf("pids sandbox-wide without pids or in %v", d)
		}
	})
}

func TestScaleToHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		cpu  map[string]uint64
		host uint64
		want map[string]uint64
	}{
		{"sentry counts twice the host: halved", map[string]uint64{"busy1": 4870000000, "idle2": 60000000, "s": 0}, 2465000000,
			map[string]uint64{"busy1": 2435000000, "idle2": 30000000, "s": 0}},
		{"no sentry CPU: split evenly as runsc does", map[string]uint64{"a": 0, "b": 0}, 10, map[string]uint64{"a": 5, "b": 5}},
		{"values that overflow a uint64 sum", map[string]uint64{"a": 1 << 63, "b": 1 << 63}, 100, map[string]uint64{"a": 50, "b": 50}},
		{"nothing", nil, 5, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ScaleToHost(tc.cpu, tc.host)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
