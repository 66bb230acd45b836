package identity

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// persistentSource is a source with a state (source.Persistent): what it
// was given back, and what it gives now.
type persistentSource struct {
	mu       sync.Mutex
	state    []byte
	restored []byte
	refuse   bool
}

func (p *persistentSource) Sample(context.Context) (source.Reading, error) {
	return source.Reading{}, nil
}
func (p *persistentSource) Close() error { return nil }
func (p *persistentSource) BreakdownState() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state, nil
}
func (p *persistentSource) RestoreBreakdownState(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refuse {
		return errors.New("refused")
	}
	p.restored = b
	return nil
}
func (p *persistentSource) set(b string) {
	p.mu.Lock()
	p.state = []byte(b)
	p.mu.Unlock()
}

func savedBreakdown(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Bindings) != 1 {
		t.Fatalf("%d bindings", len(st.Bindings))
	}
	var v any
	if len(st.Bindings[0].Breakdown) == 0 {
		return ""
	}
	json.Unmarshal(st.Bindings[0].Breakdown, &v)
	out, _ := json.Marshal(v)
	return string(out)
}

// TestBreakdownPersisted: a source's state is written with its binding
// when it changed, BreakdownSaveInterval after a sample, and at Close, and a
// restarted store gives it back to the restored binding's source before
// its first read; one over the cap, or refused, is dropped.
func TestBreakdownPersisted(t *testing.T) {
	dir := t.TempDir()
	var (
		mu   sync.Mutex
		srcs []*persistentSource
	)
	refuse := false
	cfg := Config{StateDir: dir, BreakdownSaveInterval: 50 * time.Millisecond, Open: func(source.SandboxRef) (source.Source, source.HostSampler, error) {
		mu.Lock()
		defer mu.Unlock()
		p := &persistentSource{refuse: refuse}
		srcs = append(srcs, p)
		return p, nil, nil
	}}
	last := func() *persistentSource {
		mu.Lock()
		defer mu.Unlock()
		return srcs[len(srcs)-1]
	}
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Bind(context.Background(), OpRun, Identity{ActorUID: "a"}, refA); err != nil {
		t.Fatal(err)
	}
	last().set(`{"split":1}`)
	// A sample arms the save (an idle store is never woken).
	s.Bindings()[0].Activation.Observe(source.Reading{Kind: source.KindCgroup, Containers: []source.Container{{ID: "c"}}}, 1)
	deadline := time.Now().Add(5 * time.Second)
	for savedBreakdown(t, dir) != `{"split":1}` && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := savedBreakdown(t, dir); got != `{"split":1}` {
		t.Fatalf("binding.json holds %q, want the changed state", got)
	}
	last().set(`{"split":2}`)
	s.Close() // saves once more
	if got := savedBreakdown(t, dir); got != `{"split":2}` {
		t.Fatalf("after Close binding.json holds %q, want the last state", got)
	}

	s, err = NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(last().restored); !strings.Contains(got, `"split":2`) {
		t.Errorf("the restored source was given %q", got)
	}
	s.Close()
	if got := savedBreakdown(t, dir); got != `{"split":2}` {
		t.Errorf("a restored state not given anew by its source was not kept: %q", got)
	}

	t.Run("refused", func(t *testing.T) {
		refuse = true
		s, err := NewStore(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		refuse = false
		if got := savedBreakdown(t, dir); got != "" {
			t.Errorf("a refused state persisted again: %q", got)
		}
	})
	t.Run("over the cap", func(t *testing.T) {
		b, _ := os.ReadFile(filepath.Join(dir, stateFileName))
		var st stateFile
		json.Unmarshal(b, &st)
		st.Bindings[0].Breakdown = json.RawMessage(`"` + strings.Repeat("x", source.MaxBreakdownStateBytes) + `"`)
		out, _ := encodeState(st)
		os.WriteFile(filepath.Join(dir, stateFileName), out, 0o600)
		s, err := NewStore(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Bindings()) != 1 {
			t.Fatalf("%d bindings: the binding lost with its state", len(s.Bindings()))
		}
		if got := last().restored; got != nil {
			t.Errorf("the source was given %d bytes", len(got))
		}
		s.Close()
	})
}
