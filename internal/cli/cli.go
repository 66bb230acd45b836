// Package cli is what the daemons' main functions (statsd, statsagent,
// statsnri) share: the errors run returns for a usage mistake and for
// --version, and how run's error becomes what is printed and the exit
// status.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sandboxstats/sandboxstats/internal/version"
)

// UsageError is a command-line mistake: exit status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the mistake.
func (e UsageError) Unwrap() error { return e.Err }

// ErrVersion is what run returns for --version: main prints the version.
var ErrVersion = errors.New("version requested")

// ExitStatus prints what run's err asks for (program's version, or the
// error once, a usage error with a pointer to --help) and returns the exit
// status: 0 after a clean shutdown, --help or --version, 2 for a usage
// error, 1 otherwise.
func ExitStatus(program string, err error, stdout, stderr io.Writer) int {
	var ue UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrVersion):
		fmt.Fprint(stdout, version.Get().Text(program))
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\nRun %s --help for the flags.\n", program, err, program)
		return 2
	default:
		fmt.Fprintln(stderr, program+":", err)
		return 1
	}
}
