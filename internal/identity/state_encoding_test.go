package identity

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
)

// fillState sets every exported field reachable from v: each string and
// number to a value of its own (n counts them), each bool to true, each
// pointer to a new value, each slice to one element and each map to one
// entry. A json.RawMessage holds a JSON object.
func fillState(v reflect.Value, n *int) {
	if v.Type() == reflect.TypeFor[json.RawMessage]() {
		*n++
		v.SetBytes(fmt.Appendf(nil, `{"state":%d}`, *n))
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillState(v.Elem(), n)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillState(v.Field(i), n)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillState(v.Index(0), n)
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillState(k, n)
		fillState(e, n)
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(k, e)
	case reflect.String:
		*n++
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		*n++
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		*n++
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		*n++
		v.SetFloat(float64(*n) + 0.5)
	default:
		panic(fmt.Sprintf("fillState: kind %v not handled", v.Kind()))
	}
}

// compactJSON compares JSON texts as compacted: a state file holds a
// source's state indented.
var compactJSON = cmp.Transformer("compact", func(m json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, m); err != nil {
		return "invalid: " + string(m)
	}
	return b.String()
})

// TestStateFilesEncoding: binding.json and ended.json with every field set
// are the bytes of testdata/*.golden (go test -update rewrites them), and
// decode back to what was written. The bytes are what statsd has always
// written: a change in how a state file is encoded shows here.
func TestStateFilesEncoding(t *testing.T) {
	var (
		n     int
		state stateFile
		ended endedFile
	)
	fillState(reflect.ValueOf(&state).Elem(), &n)
	state.Binding, state.LastCleared = nil, "" // version 1's fields: read, never written
	fillState(reflect.ValueOf(&ended).Elem(), &n)
	for _, tc := range []struct {
		golden  string
		in, out any
	}{
		{"binding", state, &stateFile{}},
		{"ended", ended, &endedFile{}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			got, err := encodeState(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			testenv.Golden(t, tc.golden, got)
			if err := json.Unmarshal(got, tc.out); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.in, reflect.ValueOf(tc.out).Elem().Interface(), cmpopts.IgnoreUnexported(Ended{}), cmpopts.IgnoreFields(Ended{}, "InstanceID"), compactJSON); diff != "" {
				t.Errorf("decoded (-written +read):\n%s", diff)
			}
		})
	}
}
