package telemetry

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the names table of docs/statsagent.md from the registry")

const (
	registryPath = "../../docs/telemetry/registry.yaml"
	docsPath     = "../../docs/statsagent.md"
	tableBegin   = "<!-- registry table begin -->\n"
	tableEnd     = "<!-- registry table end -->"
)

// TestDocsTable: docs/statsagent.md's names table is the registry's.
func TestDocsTable(t *testing.T) {
	reg, err := Load(registryPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(doc), tableBegin)
	if !ok {
		t.Fatalf("%s: no %q", docsPath, tableBegin)
	}
	table, after, ok := strings.Cut(rest, tableEnd)
	if !ok {
		t.Fatalf("%s: no %q", docsPath, tableEnd)
	}
	want := reg.DocsTable()
	if table == want {
		return
	}
	if *update {
		if err := os.WriteFile(docsPath, []byte(before+tableBegin+want+tableEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the names table is not the registry's: run go test ./internal/telemetry -run TestDocsTable -update", docsPath)
}

// TestParseRefuses: a registry naming an undeclared attribute, an unknown
// instrument or a name twice does not load.
func TestParseRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"undeclared attribute": "attributes: {a: {type: string}}\nmetrics:\n  - {name: m, instrument: counter, unit: s, attributes: [b]}\n",
		"unknown instrument":   "metrics:\n  - {name: m, instrument: meter, unit: s}\n",
		"twice":                "metrics:\n  - {name: m, instrument: counter, unit: s}\n  - {name: m, instrument: gauge, unit: s}\n",
		"unknown field":        "metrics:\n  - {name: m, instrument: counter, units: s}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(text)); err == nil {
				t.Error("parsed")
			}
		})
	}
}
