package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// globalFlags may come before the command as well as after it: each is
// handed to the command as if given right after its name, in this order (so
// that for the lifecycle commands, which take --socket as an alias,
// --lifecycle-socket wins), and the command's own flags after it win. A
// command that does not take one ignores it, so an alias such as
// "statsctl --socket S --lifecycle-socket L" works for every command.
var globalFlags = []struct{ name, arg, usage string }{
	{"socket", "PATH", "statsd's stats socket (default " + defaultSocket + ")"},
	{"lifecycle-socket", "PATH", "its lifecycle socket, for run-, restore- and checkpoint-workload (default " + defaultLifecycleSocket + ")"},
	{"timeout", "DURATION", "deadline of each call (default 10s)"},
}

// errShowVersion is parseGlobals' answer to --version before the command.
var errShowVersion = errors.New("version requested")

// parseGlobals splits args into the global flags before the command (as
// "--name=value") and the rest, the command and its arguments. It accepts
// -name and --name, with the value as the next argument or after "=";
// -h/--help and --version end it (flag.ErrHelp, errShowVersion); "--"
// ends the flags. A command's own flag before the command is a usage error
// that says where it goes.
func parseGlobals(args []string) (globals, rest []string, err error) {
	for len(args) > 0 {
		a := args[0]
		if a == "--" {
			return globals, args[1:], nil
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		switch name {
		case "h", "help":
			return nil, nil, flag.ErrHelp
		case "version":
			return nil, nil, errShowVersion
		}
		known := false
		for _, g := range globalFlags {
			known = known || g.name == name
		}
		if !known {
			return nil, nil, usageError{fmt.Errorf("%s is not a global flag (those are --socket, --lifecycle-socket, --timeout): a command's own flags go after it", a)}
		}
		args = args[1:]
		if !hasValue {
			if len(args) == 0 {
				return nil, nil, usageError{fmt.Errorf("flag needs an argument: %s", a)}
			}
			value, args = args[0], args[1:]
		}
		globals = append(globals, "--"+name+"="+value)
	}
	// Keep the table's order, the last of repeated ones.
	var ordered []string
	for _, g := range globalFlags {
		last := ""
		for _, v := range globals {
			if strings.HasPrefix(v, "--"+g.name+"=") {
				last = v
			}
		}
		if last != "" {
			ordered = append(ordered, last)
		}
	}
	return ordered, args, nil
}
