package otlp

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// sendResult is what became of a batch.
type sendResult int

const (
	sent      sendResult = iota
	keep                 // not taken: send again later
	tooLarge             // refused for its size: send again in smaller batches
	uncertain            // may have been taken: send again later (the consumer deduplicates by log.record.uid)
	rejected             // refused: dropped
)

// outcome is what became of one export: its result and, for one the
// collector took (sent), how many of its items it said it rejected (an
// OTLP partial success).
type outcome struct {
	res      sendResult
	rejected int64
}

// classify says what an export's error means for its batch, note being
// what its transport saw (nil: nothing known): sent (no error, or a
// partial success: the collector took the request, rejecting the items it
// counts); keep (the collector surely did not take it: not reached,
// refused for now); tooLarge (refused for its size: send it in smaller
// parts); uncertain (a timeout, or a connection cut after the request was
// written and before any answer: it may have been taken; sent again later
// all the same, and counted resent); rejected.
func (p *Pipeline) classify(err error, note *sendNote) outcome {
	if err == nil {
		return outcome{res: sent}
	}
	if n, ok := partialSuccess(err); ok {
		return outcome{res: sent, rejected: n}
	}
	if notConnected(err) || (p.conn != nil && p.conn.GetState() != connectivity.Ready && timedOut(err) && !note.wroteRequest()) {
		return outcome{res: keep} // never left: no connection was up
	}
	switch {
	case status.Code(err) == codes.ResourceExhausted && !hasRetryInfo(err),
		strings.Contains(err.Error(), "413 Request Entity Too Large"):
		return outcome{res: tooLarge}
	case timedOut(err), note.cutAfterWrite(err):
		return outcome{res: uncertain}
	case status.Code(err) == codes.Unavailable, status.Code(err) == codes.ResourceExhausted,
		strings.Contains(err.Error(), "retry-able request failure"): // otlploghttp: 429, 502, 503, 504
		return outcome{res: keep}
	}
	return outcome{res: rejected}
}

// partialSuccess reports whether err is (or joins) an OTLP partial success
// (the collector answered OK, with a warning or a count of items it
// rejected) and how many it rejected. The exporters return it as an
// error of their internal PartialSuccess type (one per exporter module,
// out of reach of errors.As), so it is found by its type's name and
// package and read by its RejectedItems field.
func partialSuccess(err error) (rejected int64, ok bool) {
	if err == nil {
		return 0, false
	}
	if ps, ok := err.(*PartialSuccess); ok {
		return max(ps.RejectedItems, 0), true
	}
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if t := v.Type(); t.Kind() == reflect.Struct && t.Name() == "PartialSuccess" &&
		strings.HasPrefix(t.PkgPath(), "go.opentelemetry.io/otel/exporters/otlp/") {
		if f := v.FieldByName("RejectedItems"); f.IsValid() && f.CanInt() {
			return max(f.Int(), 0), true
		}
	}
	var errs []error
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		errs = u.Unwrap()
	case interface{ Unwrap() error }:
		errs = []error{u.Unwrap()}
	}
	for _, e := range errs {
		if n, found := partialSuccess(e); found {
			rejected, ok = rejected+n, true
		}
	}
	return rejected, ok
}

// timedOut reports whether err is an export's deadline or a timeout, or a
// cancellation: the request may have reached the collector.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Canceled ||
		(errors.As(err, &ne) && ne.Timeout())
}

// notConnected reports whether err says no connection could be made: the
// request never left.
func notConnected(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// hasRetryInfo reports whether a gRPC status carries RetryInfo (OTLP: a
// ResourceExhausted with it is a throttle, to retry; without it the
// request itself is too large).
func hasRetryInfo(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}

// sendNote is what one export's transport saw: whether its request was
// written whole to a connection (gRPC: the message handed to an open
// stream; HTTP: the request written), and whether any answer came back
// (gRPC: the server's headers or trailers; HTTP: the response's first
// byte). Written and no answer, then an error: the collector may have
// taken the request before the connection was cut.
type sendNote struct {
	wrote, answered atomic.Bool
}

type sendNoteKey struct{}

// withSendNote returns ctx carrying a new sendNote, which the gRPC stats
// handler (noteHandler) and an HTTP client trace fill in.
func withSendNote(ctx context.Context) (context.Context, *sendNote) {
	n := &sendNote{}
	ctx = context.WithValue(ctx, sendNoteKey{}, n)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				n.wrote.Store(true)
			}
		},
		GotFirstResponseByte: func() { n.answered.Store(true) },
	})
	return ctx, n
}

func (n *sendNote) wroteRequest() bool { return n != nil && n.wrote.Load() }

// cutAfterWrite reports whether err ended an export whose request was
// written and never answered. A gRPC status converted from a non-gRPC HTTP
// answer (a proxy's 503) is an answer.
func (n *sendNote) cutAfterWrite(err error) bool {
	return n.wroteRequest() && !n.answered.Load() &&
		!strings.Contains(err.Error(), "unexpected HTTP status code received from server")
}

// noteHandler is the gRPC connection's stats handler: it fills in the
// sendNote of the export an RPC belongs to.
type noteHandler struct{}

func (noteHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (noteHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	n, _ := ctx.Value(sendNoteKey{}).(*sendNote)
	if n == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		// A new attempt: gRPC retries transparently only an attempt the
		// server did not process (refused stream, GOAWAY), so what that
		// one wrote never reached it.
		n.wrote.Store(false)
	case *stats.OutPayload:
		n.wrote.Store(true)
	case *stats.InHeader, *stats.InTrailer, *stats.InPayload:
		n.answered.Store(true)
	}
}

func (noteHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (noteHandler) HandleConn(context.Context, stats.ConnStats) {}
