package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sandboxstats/sandboxstats/internal/version"
)

// readVersion is the build information `statsctl version` prints (tests fix
// it).
var readVersion = version.Get

func runVersion(_ context.Context, e *env, args []string) error {
	fs := flagSet(e, "version", "Print statsctl's version: the module and its version, the VCS revision, commit time and dirty flag, and the Go version it was built with (from the build information)")
	var out outputFlag
	out.register(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	info := readVersion()
	if out.format == "json" {
		b, err := json.MarshalIndent(info, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}
	_, err := fmt.Fprint(e.stdout, info.Text("statsctl"))
	return err
}
