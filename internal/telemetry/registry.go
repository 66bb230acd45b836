// Package telemetry reads the registry of every metric and event the node
// agent emits (docs/telemetry/registry.yaml): the one list of names,
// instruments, units and attributes, over OTLP and Prometheus, that tests
// hold the code and the docs to.
package telemetry

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sandboxstats/sandboxstats/internal/bounded"
)

// maxRegistryBytes bounds the registry file.
const maxRegistryBytes = 1 << 20

// Registry is the parsed registry, its attribute groups expanded.
type Registry struct {
	Groups         map[string][]string  `yaml:"groups"`
	Attributes     map[string]Attribute `yaml:"attributes"`
	Resource       Attrs                `yaml:"resource"`
	Metrics        []Metric             `yaml:"metrics"`
	PrometheusOnly []PrometheusOnly     `yaml:"prometheus_only"`
	Events         []Event              `yaml:"events"`
}

// Attribute is one attribute key's type and meaning.
type Attribute struct {
	Type  string `yaml:"type"` // string, int, double, bool
	Unit  string `yaml:"unit"`
	Brief string `yaml:"brief"`
}

// Attrs are required and optional attribute keys.
type Attrs struct {
	Required []string `yaml:"required"`
	Optional []string `yaml:"optional"`
}

// Metric is one OTLP metric and the Prometheus metrics it maps to.
type Metric struct {
	Name       string   `yaml:"name"`
	Instrument string   `yaml:"instrument"` // counter, updowncounter, gauge, histogram
	Unit       string   `yaml:"unit"`
	Stability  string   `yaml:"stability"`
	Attributes []string `yaml:"attributes"` // required, groups expanded
	Optional   []string `yaml:"optional"`
	Prometheus []string `yaml:"prometheus"`
	Brief      string   `yaml:"brief"`
}

// PrometheusOnly is a Prometheus metric with no OTLP counterpart, and why.
type PrometheusOnly struct {
	Name string `yaml:"name"`
	Why  string `yaml:"why"`
}

// Event is one event name, its attributes, and each kind's own.
type Event struct {
	Name       string           `yaml:"name"`
	Stability  string           `yaml:"stability"`
	Brief      string           `yaml:"brief"`
	Attributes []string         `yaml:"attributes"`
	Optional   []string         `yaml:"optional"`
	Kinds      map[string]Attrs `yaml:"kinds"`
}

// Instruments a registry may name.
var instruments = []string{"counter", "updowncounter", "gauge", "histogram"}

// Load reads and checks the registry at path.
func Load(path string) (*Registry, error) {
	b, err := bounded.ReadFile(path, maxRegistryBytes)
	if err != nil {
		return nil, fmt.Errorf("telemetry registry: %w", err)
	}
	return Parse(b)
}

// Parse parses a registry and checks it: every attribute it names is
// declared, every instrument known, no name twice; groups are expanded.
func Parse(b []byte) (*Registry, error) {
	var r Registry
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("telemetry registry: %w", err)
	}
	var errs []string
	expand := func(where string, keys []string) []string {
		var out []string
		for _, k := range keys {
			if g, ok := r.Groups[k]; ok {
				out = append(out, g...)
				continue
			}
			out = append(out, k)
		}
		for _, k := range out {
			if _, ok := r.Attributes[k]; !ok {
				errs = append(errs, fmt.Sprintf("%s: attribute %q not declared", where, k))
			}
		}
		return out
	}
	seen := map[string]bool{}
	once := func(name string) {
		if seen[name] {
			errs = append(errs, fmt.Sprintf("%q listed twice", name))
		}
		seen[name] = true
	}
	for i := range r.Metrics {
		m := &r.Metrics[i]
		once(m.Name)
		if !slices.Contains(instruments, m.Instrument) {
			errs = append(errs, fmt.Sprintf("%s: instrument %q: want one of %v", m.Name, m.Instrument, instruments))
		}
		m.Attributes, m.Optional = expand(m.Name, m.Attributes), expand(m.Name, m.Optional)
		for _, p := range m.Prometheus {
			once(p)
		}
	}
	for _, p := range r.PrometheusOnly {
		once(p.Name)
	}
	for i := range r.Events {
		e := &r.Events[i]
		once(e.Name)
		e.Attributes, e.Optional = expand(e.Name, e.Attributes), expand(e.Name, e.Optional)
		for k, a := range e.Kinds {
			e.Kinds[k] = Attrs{Required: expand(e.Name+" "+k, a.Required), Optional: expand(e.Name+" "+k, a.Optional)}
		}
	}
	expand("resource", append(r.Resource.Required, r.Resource.Optional...))
	if len(errs) > 0 {
		return nil, fmt.Errorf("telemetry registry: %s", strings.Join(errs, "; "))
	}
	return &r, nil
}

// Metric returns the metric named name.
func (r *Registry) Metric(name string) (Metric, bool) {
	i := slices.IndexFunc(r.Metrics, func(m Metric) bool { return m.Name == name })
	if i < 0 {
		return Metric{}, false
	}
	return r.Metrics[i], true
}

// PrometheusNames are every Prometheus name the registry lists.
func (r *Registry) PrometheusNames() []string {
	var out []string
	for _, m := range r.Metrics {
		out = append(out, m.Prometheus...)
	}
	for _, p := range r.PrometheusOnly {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// DocsTable is the names table of docs/statsagent.md: each OTLP metric
// beside the Prometheus metrics it maps to.
func (r *Registry) DocsTable() string {
	var b strings.Builder
	b.WriteString("| OTLP metric | instrument | unit | attributes besides the workload's | Prometheus |\n|---|---|---|---|---|\n")
	workload := r.Groups["workload"]
	for _, m := range r.Metrics {
		var extra []string
		for _, a := range m.Attributes {
			if !slices.Contains(workload, a) {
				extra = append(extra, "`"+a+"`")
			}
		}
		for _, a := range m.Optional {
			if !slices.Contains(workload, a) && !slices.Contains(r.Groups["actor"], a) {
				extra = append(extra, "`"+a+"` (optional)")
			}
		}
		var prom []string
		for _, p := range m.Prometheus {
			prom = append(prom, "`"+p+"`")
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s |\n", m.Name, m.Instrument, m.Unit, strings.Join(extra, ", "), strings.Join(prom, ", "))
	}
	for _, p := range r.PrometheusOnly {
		fmt.Fprintf(&b, "| (none: %s) | | | | `%s` |\n", p.Why, p.Name)
	}
	return b.String()
}
