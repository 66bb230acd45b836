package sentryusage

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

// jsonReply is encoding/json's reading of the whole reply b (decodeValue,
// the reference): the reply, whether any byte follows it, and the error.
func jsonReply(b []byte) (wireReply, bool, error) {
	r := bytes.NewReader(b)
	rep, dec, err := decodeValue(r, len(b), "not JSON ")
	if err != nil {
		return wireReply{}, false, err
	}
	n, _ := dec.Buffered().Read(make([]byte, 1))
	return rep, n > 0 || r.Len() > 0, nil
}

// fastCases are replies the hand decoder takes, each with encoding/json's
// reading of it, and replies it leaves to encoding/json.
var fastCases = []struct {
	name  string
	reply string
	taken bool
}{
	{"keys in another case", `{"SUCCESS":true,"Err":"","Result":{"EVENT":{"Type":"stats","ID":"a","Data":{"CPU":{"Usage":{"Total":5}}}},"containerusage":{"a":1}}}`, true},
	{"nulls", `{"success":null,"err":null,"result":{"event":{"type":null,"data":{"cpu":null,"memory":{"usage":null},"pids":{"current":null}}},"containerUsage":{"a":null}}}`, true},
	{"null result and map", `{"success":false,"err":"no","result":null}`, true},
	{"an empty map", replyWithS(`{"event":{"type":"stats","data":{}},"containerUsage":{}}`), true},
	{"a key twice in the map: the last", replyWithS(`{"event":{"type":"stats","data":{}},"containerUsage":{"a":1,"a":2}}`), true},
	{"unknown fields of every kind", replyWithS(`{"x":[1,-2.5e+3,"\u00e9\n",true,false,null,{"y":[]}],"event":{"type":"stats","data":{"z":0}}}`), true},
	{"white space and a byte after", " \t\n{\"success\":true}\r\n", true},
	{"the largest uint64", replyWithS(`{"event":{"type":"stats","data":{"pids":{"current":18446744073709551615}}}}`), true},
	{"a field twice", `{"success":true,"success":false}`, false},
	{"a field twice in another case", `{"success":true,"Success":false}`, false},
	{"an escape in a key", `{"succ\u0065ss":true}`, false},
	{"a key past ASCII (the long s folds to s)", "{\"\u017fuccess\":true}", false},
	{"an escape in a value", `{"success":true,"err":"\n"}`, false},
	{"a uint64 overflow", replyWithS(`{"event":{"type":"stats","data":{"pids":{"current":18446744073709551616}}}}`), false},
	{"a fraction", replyWithS(`{"event":{"type":"stats","data":{"pids":{"current":1.0}}}}`), false},
	{"a leading zero", replyWithS(`{"event":{"type":"stats","data":{"pids":{"current":01}}}}`), false},
	{"a type error", `{"success":"yes"}`, false},
	{"not whole", `{"success":true,"err":"","result":{"event"`, false},
	{"not an object", `[]`, false},
	{"bad UTF-8 in a map key", replyWithS("{\"containerUsage\":{\"\xff\":1}}"), false},
}

func replyWithS(result string) string { return string(replyWith(result)) }

func TestFastReply(t *testing.T) {
	for name, b := range getFixtures(t) {
		fastCases = append(fastCases, struct {
			name  string
			reply string
			taken bool
		}{"fixture " + name, string(b), true})
	}
	for _, tc := range fastCases {
		t.Run(tc.name, func(t *testing.T) {
			rep, end, ok := fastReply([]byte(tc.reply))
			if ok != tc.taken {
				t.Fatalf("taken %v, want %v", ok, tc.taken)
			}
			want, wantTrailing, err := jsonReply([]byte(tc.reply))
			if !ok {
				return
			}
			if err != nil {
				t.Fatalf("taken, but encoding/json: %v", err)
			}
			if diff := cmp.Diff(want, rep); diff != "" {
				t.Errorf("(-encoding/json +hand):\n%s", diff)
			}
			if got := end < len(tc.reply); got != wantTrailing {
				t.Errorf("trailing %v, encoding/json's %v", got, wantTrailing)
			}
		})
	}
}

// TestDecodeReplyFast: decodeReplyFast gives decodeReply's result whether
// the hand decoder takes the reply or not, whole in one read or a byte a
// read, and its error when there is one.
func TestDecodeReplyFast(t *testing.T) {
	fx := getFixtures(t)
	for _, tc := range []struct {
		name  string
		reply string
		max   int
	}{
		{"fixture", string(fx["release-20221219-noarg.json"]), 64 << 10},
		{"taken, a byte after", string(fx["release-20221219-noarg.json"]) + "\n", 64 << 10},
		{"left to encoding/json", `{"success":true,"success":false}`, 64 << 10},
		{"larger than the cap", string(fx["release-20221219-noarg.json"]), 100},
		{"garbage", "HTTP/1.1 400 Bad Request\r\n", 64 << 10},
		{"cut short", `{"success":true,"err":"","result":{"event"`, 64 << 10},
		{"closed at once", "", 64 << 10},
		{"larger than the first read's buffer", replyWithS(`{"event":{"type":"stats","data":{}},"x":"` + strings.Repeat("y", fastBufBytes) + `"}`), 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, reader := range []func() io.Reader{
				func() io.Reader { return strings.NewReader(tc.reply) },
				func() io.Reader { return iotest.OneByteReader(strings.NewReader(tc.reply)) },
			} {
				wantRep, wantTrailing, wantErr := decodeReply(reader(), tc.max) // an error's excerpt is what was read
				r := reader()
				rep, trailing, err := decodeReplyFast(r, tc.max)
				if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
					t.Fatalf("error %v, want %v", err, wantErr)
				}
				if errors.Is(wantErr, errClosedEmpty) != errors.Is(err, errClosedEmpty) {
					t.Fatalf("error %v does not wrap errClosedEmpty as %v", err, wantErr)
				}
				if diff := cmp.Diff(wantRep, rep); diff != "" {
					t.Errorf("(-decodeReply +decodeReplyFast):\n%s", diff)
				}
				if _, one := r.(interface{ Len() int }); one && trailing != wantTrailing {
					t.Errorf("trailing %v, want %v", trailing, wantTrailing)
				}
			}
		})
	}
}

func TestDecodeReplyFastAllocs(t *testing.T) {
	b := getFixtures(t)["release-20221219-noarg.json"]
	r := bytes.NewReader(b)
	allocs := func(decode func(io.Reader, int) (wireReply, bool, error)) float64 {
		return testing.AllocsPerRun(100, func() {
			r.Reset(b)
			if _, _, err := decode(r, 64<<10); err != nil {
				t.Fatal(err)
			}
		})
	}
	got, json := allocs(decodeReplyFast), allocs(decodeReply)
	t.Logf("%.0f allocations a reply (encoding/json: %.0f)", got, json)
	if got > 16 {
		t.Errorf("%.0f allocations a reply, want at most 16", got)
	}
}

// FuzzFastReply holds the hand decoder to encoding/json: every reply it
// takes, encoding/json decodes without error into the same wireReply, with
// bytes after it or not alike.
func FuzzFastReply(f *testing.F) {
	for _, b := range getFixtures(f) {
		f.Add(b)
	}
	for _, tc := range fastCases {
		f.Add([]byte(tc.reply))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rep, end, ok := fastReply(b)
		if !ok {
			return
		}
		if end > len(b) {
			t.Fatalf("end %d past %d bytes", end, len(b))
		}
		want, wantTrailing, err := jsonReply(b)
		if err != nil {
			t.Fatalf("taken, but encoding/json: %v", err)
		}
		if diff := cmp.Diff(want, rep); diff != "" {
			t.Fatalf("(-encoding/json +hand):\n%s", diff)
		}
		if got := end < len(b); got != wantTrailing {
			t.Fatalf("trailing %v, encoding/json's %v", got, wantTrailing)
		}
	})
}

// BenchmarkDecodeReply: the fixture reply of three containers, by hand and
// by encoding/json.
func BenchmarkDecodeReply(b *testing.B) {
	reply := getFixtures(b)["release-20221219-noarg.json"]
	for _, bc := range []struct {
		name   string
		decode func(io.Reader, int) (wireReply, bool, error)
	}{{"hand", decodeReplyFast}, {"encoding-json", decodeReply}} {
		b.Run(bc.name, func(b *testing.B) {
			r := bytes.NewReader(reply)
			for b.Loop() {
				r.Reset(reply)
				if _, _, err := bc.decode(r, 64<<10); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
