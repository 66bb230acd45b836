package gvisor

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSplitterAdvance(t *testing.T) {
	type step struct {
		name     string
		in       splitInput
		want     map[string]uint64
		wantOwn  uint64
		wantPend uint64
	}
	const s = "sbx"
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first sample split cumulatively, then by increments", []step{
			{"cumulative", splitInput{s, 1000, 100, map[string]uint64{"p": 0, "a": 3e9, "b": 1e9}},
				map[string]uint64{"p": 0, "a": 675, "b": 225}, 100, 0},
			// +400 usec of application CPU; a's figure grew 1 s, b's 3 s:
			// a gets 100, b 300, whatever their totals.
			{"increment", splitInput{s, 1500, 200, map[string]uint64{"p": 0, "a": 4e9, "b": 4e9}},
				map[string]uint64{"p": 0, "a": 775, "b": 525}, 200, 0},
		}},
		{"an exit leaves the others unchanged", []step{
			{"both", splitInput{s, 1000, 0, map[string]uint64{"a": 1e9, "b": 1e9}},
				map[string]uint64{"a": 500, "b": 500}, 0, 0},
			{"b gone: a gets the whole increase", splitInput{s, 1600, 0, map[string]uint64{"a": 2e9}},
				map[string]uint64{"a": 1100}, 0, 0},
		}},
		{"the pause container's part", []step{
			{"pause grew too", splitInput{s, 1000, 0, map[string]uint64{"p": 1e9, "a": 3e9}},
				map[string]uint64{"p": 250, "a": 750}, 0, 0},
		}},
		{"no growth of the sentry's figures: the increase is carried over", []step{
			{"first", splitInput{s, 1000, 0, map[string]uint64{"a": 1e9, "b": 1e9}},
				map[string]uint64{"a": 500, "b": 500}, 0, 0},
			{"sum of increments 0", splitInput{s, 1300, 0, map[string]uint64{"a": 1e9, "b": 1e9}},
				map[string]uint64{"a": 500, "b": 500}, 0, 300},
			{"then b grew: the 300 and the 100 go to b", splitInput{s, 1400, 0, map[string]uint64{"a": 1e9, "b": 2e9}},
				map[string]uint64{"a": 500, "b": 900}, 0, 0},
		}},
		{"reordered samples change nothing", []step{
			{"newer first", splitInput{s, 2000, 100, map[string]uint64{"a": 2e9, "b": 2e9}},
				map[string]uint64{"a": 950, "b": 950}, 100, 0},
			{"older one (lower cgroup, lower own)", splitInput{s, 1500, 50, map[string]uint64{"a": 1e9, "b": 3e9}},
				map[string]uint64{"a": 950, "b": 950}, 100, 0},
			{"a lower sentry figure does not count again", splitInput{s, 2100, 100, map[string]uint64{"a": 1e9, "b": 3e9}},
				map[string]uint64{"a": 950, "b": 1050}, 100, 0},
		}},
		{"a new container starts from 0", []step{
			{"a", splitInput{s, 1000, 0, map[string]uint64{"a": 1e9}},
				map[string]uint64{"a": 1000}, 0, 0},
			{"c appears with 1 s", splitInput{s, 1200, 0, map[string]uint64{"a": 2e9, "c": 1e9}},
				map[string]uint64{"a": 1100, "c": 100}, 0, 0},
		}},
		{"own above the cgroup: nothing to split", []step{
			{"first", splitInput{s, 100, 200, map[string]uint64{"a": 1e9}},
				map[string]uint64{"a": 0}, 200, 0},
		}},
		{"another sandbox id starts over", []step{
			{"first", splitInput{s, 1000, 0, map[string]uint64{"a": 1e9}},
				map[string]uint64{"a": 1000}, 0, 0},
			{"restored", splitInput{"other", 300, 10, map[string]uint64{"a": 1e8}},
				map[string]uint64{"a": 290}, 10, 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sp splitter
			for _, st := range tc.steps {
				got, own := sp.advance(st.in)
				if diff := cmp.Diff(st.want, got); diff != "" || own != st.wantOwn || sp.pending != st.wantPend {
					t.Errorf("%s: own %d (want %d), pending %d (want %d), attributed (-want +got)\n%s", st.name, own, st.wantOwn, sp.pending, st.wantPend, diff)
				}
			}
		})
	}
	t.Run("an exited container's figure is kept in the state", func(t *testing.T) {
		var sp splitter
		sp.advance(splitInput{s, 1000, 0, map[string]uint64{"a": 1e9, "b": 1e9}})
		sp.advance(splitInput{s, 1600, 0, map[string]uint64{"a": 2e9}})
		if sp.attr["b"] != 500 {
			t.Errorf("b's attributed figure %d, want 500 kept", sp.attr["b"])
		}
	})
}

// TestSplitterMonotonic: whatever order samples of a growing sandbox come
// in, no figure goes down and the attributed sum never exceeds the
// application part of the highest cgroup figure seen.
func TestSplitterMonotonic(t *testing.T) {
	var samples []splitInput
	for i := range uint64(40) {
		samples = append(samples, splitInput{"s", 1000 + 97*i, 10 * (i / 3), map[string]uint64{"p": 1e7 * i, "a": 3e7 * i * i, "b": 5e8 + 1e7*(i%7)*i}})
	}
	// A fixed shuffle: later samples first, every third swapped back.
	order := []int{}
	for i := range samples {
		j := i
		if i%3 == 0 && i+1 < len(samples) {
			j = i + 1
		} else if i%3 == 1 {
			j = i - 1
		}
		order = append(order, j)
	}
	var sp splitter
	last := map[string]uint64{}
	var lastOwn, maxCgroup uint64
	for _, i := range order {
		got, own := sp.advance(samples[i])
		maxCgroup = max(maxCgroup, samples[i].CgroupUsec)
		var sum uint64
		for c, v := range got {
			if v < last[c] {
				t.Fatalf("sample %d: %s went down %d -> %d", i, c, last[c], v)
			}
			last[c] = v
			sum += v
		}
		if own < lastOwn || sum+own > maxCgroup {
			t.Fatalf("sample %d: own %d (was %d), sum %d, cgroup %d", i, own, lastOwn, sum, maxCgroup)
		}
		lastOwn = own
	}
}
