package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxstats/sandboxstats/internal/api"
	"github.com/sandboxstats/sandboxstats/internal/sockaddr"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the call failed; one line on stderr says why
	exitUsage = 2
)

const (
	defaultSocket          = "/run/statsd/statsd.sock"
	defaultLifecycleSocket = "/run/statsd/lifecycle/statsd.sock"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, env *env, args []string) error
}

// commands is the command table: usage, dispatch and the completion scripts
// are made from it (set in init: completion reads it).
var commands []command

func init() {
	commands = []command{
		{"stats", "one sample of the named workload", runStats},
		{"active", "the discovery read: whatever workload is bound here", runActive},
		{"watch", "sample repeatedly: CPU cores used per interval, memory", runWatch},
		{"host", "the runner-layer (host) view; --window for differences and rates", runHost},
		{"poll", "one sweep over a socket glob, as the node agent sees it", runPoll},
		{"drift", "open drift findings (what was told vs what runs) and recent events", runDrift},
		{"activations", "the activations that ended here recently, with their final samples", runActivations},
		{"health", "grpc.health.v1 status of statsd", runHealth},
		{"run-workload", "bind a workload (launcher side)", runRunWorkload},
		{"restore-workload", "bind a restored workload (launcher side)", runRestoreWorkload},
		{"update-containers", "replace the bound workload's container set, same activation (launcher side)", runUpdateContainers},
		{"checkpoint-workload", "end the bound activation (a final sample) and forget it (launcher side)", runCheckpointWorkload},
		{"own-dir", "give a directory to a non-root uid (the DaemonSet's init container)", runOwnDir},
		{"version", "statsctl's version: module, VCS revision and time, Go", runVersion},
		{"completion", "a shell completion script: bash, zsh or fish", runCompletion},
	}
}

// env is what every subcommand writes to, and the global flags given before
// it.
type env struct {
	stdout, stderr io.Writer
	globals        []string // "--name=value", in globalFlags order
	lastFlags      *flag.FlagSet
}

// usageError marks a command-line mistake (exit 2).
type usageError struct{ error }

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: statsctl [global flags] <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-20s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nGlobal flags, before or after the command (given in both places, the one after it wins):\n")
	for _, g := range globalFlags {
		fmt.Fprintf(w, "  --%-25s %s\n", g.name+" "+g.arg, g.usage)
	}
	fmt.Fprintf(w, `  A socket is a path, unix:PATH or unix:///PATH; a command ignores a global flag it does not take.

Examples:
  statsctl health
  statsctl --socket /run/statsd/sbx-1.sock active -o json
  statsctl stats --actor-uid 7f3c9a
  statsctl watch --actor-uid 7f3c9a --interval 5s --count 12
  statsctl host --actor-uid 7f3c9a --window 10s
  statsctl poll --sockets '/run/statsd/*.sock'
  statsctl run-workload --actor-uid 7f3c9a --sentry-pid 4242
  statsctl run-workload --actor-uid 7f3c9a \
      --agent-address hvsock:///run/vc/vm/7f3c9a/clh.sock:1024 --container-id web_ovl
  statsctl update-containers --actor-uid 7f3c9a --container web_ovl=web --container log_ovl=logger
  statsctl checkpoint-workload --actor-uid 7f3c9a
  source <(statsctl completion bash)

Exit status:
  0  success
  1  the call failed; one line on stderr says why (CODE REASON: message)
  2  usage error: unknown command or flag, a bad or missing value

Run 'statsctl <command> --help' or 'statsctl help <command>' for a command's flags.
`)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr}
	globals, rest, err := parseGlobals(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout)
		return exitOK
	case errors.Is(err, errShowVersion):
		rest = []string{"version"}
	case err != nil:
		fmt.Fprintf(stderr, "statsctl: %v\n", err)
		return exitUsage
	}
	e.globals = globals
	if len(rest) == 0 || rest[0] == "help" && len(rest) == 1 {
		usage(stdout)
		if len(rest) == 0 {
			return exitUsage
		}
		return exitOK
	}
	name, cmdArgs := rest[0], rest[1:]
	if name == "help" { // help <command>: the command's --help
		name, cmdArgs = rest[1], []string{"--help"}
	}
	for _, c := range commands {
		if c.name != name {
			continue
		}
		err := c.run(ctx, e, cmdArgs)
		var ue usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "statsctl %s: %v\nRun 'statsctl %s --help' for its flags.\n", c.name, err, c.name)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "statsctl %s: %s\n", c.name, describeError(err))
			return exitError
		}
	}
	fmt.Fprintf(stderr, "statsctl: unknown command %q\n", name)
	usage(stderr)
	return exitUsage
}

// describeError renders an RPC error on one line: code, reason, message.
func describeError(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return safe(err.Error())
	}
	msg := safe(strings.ReplaceAll(st.Message(), "\n", " "))
	if reason := api.ReasonOf(err); reason != "" {
		return fmt.Sprintf("%s %s: %s", codeName(st.Code().String()), safe(reason), msg)
	}
	return fmt.Sprintf("%s: %s", codeName(st.Code().String()), msg)
}

// codeName turns "FailedPrecondition" into "FAILED_PRECONDITION".
func codeName(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// flagSet makes a subcommand's flag set; commonFlags holds what most share.
func flagSet(e *env, name, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet("statsctl "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: statsctl %s [flags]\n\n%s.\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nExit status: 0 success, 1 the call failed, 2 usage error.\n")
	}
	e.lastFlags = fs
	return fs
}

type connFlags struct {
	socket  string
	timeout time.Duration
}

func (c *connFlags) register(fs *flag.FlagSet, defaultPath, what string) {
	c.socket = defaultPath
	fs.Var(sockaddr.Flag{Path: &c.socket}, "socket", "Unix socket of statsd's "+what+" service: a `path`, unix:PATH or unix:///PATH")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline of the call")
}

func (c *connFlags) dial() (*grpc.ClientConn, error) {
	target, err := sockaddr.Target(c.socket)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// open dials the socket and bounds the call by --timeout; done releases both.
func (c *connFlags) open(ctx context.Context) (context.Context, *grpc.ClientConn, func(), error) {
	cc, err := c.dial()
	if err != nil {
		return ctx, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return ctx, cc, func() { cancel(); cc.Close() }, nil
}

type outputFlag struct{ format string }

func (o *outputFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&o.format, "o", "table", "output format: table or json")
}

func (o *outputFlag) validate() error {
	if o.format != "table" && o.format != "json" {
		return usageError{fmt.Errorf("-o must be table or json, not %q", o.format)}
	}
	return nil
}

// parse parses the global flags fs has, then args (so that a flag given in
// both places is the one after the command), and rejects stray positional
// arguments.
func (e *env) parse(fs *flag.FlagSet, args []string) error {
	var own []string
	for _, g := range e.globals {
		name, _, _ := strings.Cut(strings.TrimPrefix(g, "--"), "=")
		if fs.Lookup(name) != nil {
			own = append(own, g)
		}
	}
	// The flag package would print the error and the whole usage; the
	// caller prints the error once, with a pointer to --help.
	fs.SetOutput(io.Discard)
	err := fs.Parse(append(own, args...))
	fs.SetOutput(e.stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(e.stdout)
			fs.Usage()
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	return nil
}

// writeJSON prints a message as protojson with proto field names. protojson
// varies its whitespace on purpose; compacting and re-indenting makes the
// output stable for scripts and golden files.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return err
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(jsonSafe(out.Bytes()))
	return err
}

// readCall is one call on statsd's read service.
type readCall[R proto.Message] func(context.Context, sandboxstatsv1.WorkloadStatsServiceClient) (R, error)

// runRead is the body of a read command: it adds the stats socket and -o to
// fs (which holds the command's own flags), parses args, runs check (nil:
// nothing to check) and call, and prints the answer as JSON or with table.
func runRead[R proto.Message](ctx context.Context, e *env, fs *flag.FlagSet, args []string, check func() error,
	call readCall[R], table func(io.Writer, R) error) error {
	var (
		conn connFlags
		out  outputFlag
	)
	conn.register(fs, defaultSocket, "stats")
	out.register(fs)
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if err := out.validate(); err != nil {
		return err
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	ctx, cc, done, err := conn.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	// A call may fail after it read part of the answer (a later page): what
	// it read is printed, then the error.
	resp, err := call(ctx, sandboxstatsv1.NewWorkloadStatsServiceClient(cc))
	if err != nil && !resp.ProtoReflect().IsValid() {
		return err
	}
	var werr error
	if out.format == "json" {
		werr = writeJSON(e.stdout, resp)
	} else {
		werr = table(e.stdout, resp)
	}
	if err != nil {
		return err
	}
	return werr
}
