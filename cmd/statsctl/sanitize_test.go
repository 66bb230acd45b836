package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sandboxstats/sandboxstats/internal/rate"
	"github.com/sandboxstats/sandboxstats/internal/sweep"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// hostileText is guest text aimed at the operator's terminal: an OSC that
// retitles it (ESC ] 0 ; ... BEL), a newline that forges a line of output,
// a carriage return, a C1 CSI (U+009B) and DEL.
const hostileText = "\x1b]0;pwned\x07\nACTOR forged\r\u009b31m\x7f"

// fill sets every field of m: strings to text, numbers to 1, messages
// (down to depth) filled likewise, one element in each repeated field.
func fill(m protoreflect.Message, text string, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.IsMap() || f.ContainingOneof() != nil && !f.HasOptionalKeyword() {
			continue
		}
		scalar := func() (protoreflect.Value, bool) {
			switch f.Kind() {
			case protoreflect.StringKind:
				return protoreflect.ValueOfString(text), true
			case protoreflect.BoolKind:
				return protoreflect.ValueOfBool(true), true
			case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
				return protoreflect.ValueOfInt32(1), true
			case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
				return protoreflect.ValueOfInt64(1), true
			case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
				return protoreflect.ValueOfUint32(1), true
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				return protoreflect.ValueOfUint64(1), true
			}
			return protoreflect.Value{}, false
		}
		switch {
		case f.Kind() == protoreflect.MessageKind && depth > 0:
			if f.IsList() {
				el := m.Mutable(f).List().NewElement()
				fill(el.Message(), text, depth-1)
				m.Mutable(f).List().Append(el)
			} else {
				fill(m.Mutable(f).Message(), text, depth-1)
			}
		case f.IsList():
			if v, ok := scalar(); ok {
				m.Mutable(f).List().Append(v)
			}
		default:
			if v, ok := scalar(); ok {
				m.Set(f, v)
			}
		}
	}
}

func filled[M proto.Message](m M, text string) M {
	fill(m.ProtoReflect(), text, 4)
	return m
}

// renderAll renders every statsctl output that prints strings from a
// response, each filled with text.
func renderAll(t *testing.T, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	render := func(name string, f func(*bytes.Buffer) error) {
		var b bytes.Buffer
		if err := f(&b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = b.String()
	}
	s := filled(&sandboxstatsv1.WorkloadStatsSample{}, text)
	render("stats", func(b *bytes.Buffer) error { return writeSampleTable(b, s) })
	render("active", func(b *bytes.Buffer) error {
		return writeActiveTable(b, filled(&sandboxstatsv1.StatsActiveWorkloadsResponse{}, text))
	})
	render("active-no-sample", func(b *bytes.Buffer) error {
		return writeActiveTable(b, &sandboxstatsv1.StatsActiveWorkloadsResponse{NoSampleDetail: text})
	})
	render("drift", func(b *bytes.Buffer) error {
		return writeDriftTable(b, filled(&sandboxstatsv1.ListDriftFindingsResponse{}, text))
	})
	e := filled(&sandboxstatsv1.EndedActivation{}, text)
	render("activations", func(b *bytes.Buffer) error { return writeActivationsTable(b, []*sandboxstatsv1.EndedActivation{e}) })
	for _, p := range []sandboxstatsv1.FinalProvenance{sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_LAST_GOOD_POLL, sandboxstatsv1.FinalProvenance_FINAL_PROVENANCE_NONE} {
		e := proto.Clone(e).(*sandboxstatsv1.EndedActivation)
		e.FinalProvenance = p
		render("activations-"+p.String(), func(b *bytes.Buffer) error { return writeActivationsTable(b, []*sandboxstatsv1.EndedActivation{e}) })
		render("checkpoint-"+p.String(), func(b *bytes.Buffer) error { return writeEnded(b, e) })
	}
	h1, h2 := filled(&sandboxstatsv1.HostStats{}, text), filled(&sandboxstatsv1.HostStats{}, text)
	h2.ObservedAtUnixNano = 2e9
	render("host", func(b *bytes.Buffer) error { return writeHostSample(b, h1) })
	render("host-window", func(b *bytes.Buffer) error { return writeHostWindow(b, rate.Window(h1, h2, 0)) })
	render("poll", func(b *bytes.Buffer) error {
		return writePollTable(b, []sweep.DaemonResult{
			{Socket: "/run/statsd/a.sock", Status: sweep.StatusOK, Samples: []*sandboxstatsv1.WorkloadStatsSample{s}},
			{Socket: "/run/statsd/b.sock", Status: sweep.StatusNoSample, NoSampleDetail: text},
			{Socket: "/run/statsd/c.sock", Status: sweep.StatusError, Code: codes.Internal,
				Err: fmt.Errorf("sweep: poll /run/statsd/c.sock: %w", status.Error(codes.Internal, text))},
		})
	})
	render("watch", func(b *bytes.Buffer) error {
		var w rate.Watcher
		rows := newTableWriter(b)
		s2 := proto.Clone(s).(*sandboxstatsv1.WorkloadStatsSample)
		s2.ObservedAtUnixNano += 1e9
		s2.CpuUsageUsec = proto.Uint64(2)
		for _, x := range []*sandboxstatsv1.WorkloadStatsSample{s, s2} {
			if err := rows.WriteRow(w.Observe(x)); err != nil {
				return err
			}
		}
		return nil
	})
	render("error", func(b *bytes.Buffer) error {
		_, err := fmt.Fprintln(b, describeError(status.Error(codes.Internal, text)))
		return err
	})
	return out
}

// TestNoTerminalEscapes: whatever text a response carries, statsctl's
// table output holds no control character but the newlines it writes
// itself (no ESC, BEL, CR, DEL, C1 controls), and the guest's newlines
// forge no line: each output has as many lines as with plain text.
func TestNoTerminalEscapes(t *testing.T) {
	hostile, plain := renderAll(t, hostileText), renderAll(t, "x")
	for name, out := range hostile {
		for i, r := range out {
			if (r < 0x20 && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
				t.Errorf("%s: control character %U at byte %d:\n%q", name, r, i, out)
				break
			}
		}
		if got, want := strings.Count(out, "\n"), strings.Count(plain[name], "\n"); got != want {
			t.Errorf("%s: %d lines with guest text, %d with plain text: the guest forged lines:\n%s", name, got, want, out)
		}
	}
}

func TestSafe(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"cgroup v1: /sys/fs/cgroup/memory/pod1", "cgroup v1: /sys/fs/cgroup/memory/pod1"},
		{"héllo, 世界 \ufffd", "héllo, 世界 \ufffd"},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"\u009b31m\x7f", `\u009b31m\x7f`},
		{"\u202egnp.exe", `\u202egnp.exe`},
		{"bad \xff byte", `bad \xff byte`},
		{strings.Repeat("x", maxPrinted+10), strings.Repeat("x", maxPrinted) + "...(10 bytes cut)"},
	} {
		if got := safe(tc.in); got != tc.want {
			t.Errorf("safe(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestJSONKeepsData: JSON output keeps the guest's text as it is (a script
// reads the same string back) while holding no raw byte a terminal acts on.
func TestJSONKeepsData(t *testing.T) {
	s := filled(&sandboxstatsv1.WorkloadStatsSample{}, hostileText+" \u202e")
	var b bytes.Buffer
	if err := writeJSON(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, r := range b.String() {
		if (r < 0x20 && r != '\n') || (r >= 0x7f && r <= 0x9f) || r == 0x202e {
			t.Fatalf("raw %U in JSON output:\n%s", r, b.String())
		}
	}
	var back sandboxstatsv1.WorkloadStatsSample
	if err := protojson.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(s, &back) {
		t.Errorf("JSON output does not read back as the response")
	}
	var w bytes.Buffer
	if err := newJSONWriter(&w).WriteRow(rate.Row{ActorUID: hostileText}); err != nil {
		t.Fatal(err)
	}
	var row rate.Row
	if err := json.Unmarshal(w.Bytes(), &row); err != nil || row.ActorUID != hostileText || strings.ContainsRune(w.String(), 0x9b) {
		t.Errorf("watch JSON %q: %v", w.String(), err)
	}
}
