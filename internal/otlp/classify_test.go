package otlp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	p := &Pipeline{}
	noted := func(wrote, answered bool) *sendNote {
		n := &sendNote{}
		n.wrote.Store(wrote)
		n.answered.Store(answered)
		return n
	}
	for _, tc := range []struct {
		name string
		err  error
		note *sendNote
		want sendResult
	}{
		{"nil", nil, nil, sent},
		{"unavailable", status.Error(codes.Unavailable, "x"), nil, keep},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, nil, keep},
		{"dial timeout", &url.Error{Op: "Post", Err: &net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}}, nil, keep},
		{"http 503", errors.New("retry-able request failure: body: (empty)"), nil, keep},
		{"too large", fmt.Errorf("export: %w", status.Error(codes.ResourceExhausted, "grpc: received message larger than max")), nil, tooLarge},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), nil, uncertain},
		{"context", fmt.Errorf("export: %w", context.DeadlineExceeded), nil, uncertain},
		{"http response timeout", &url.Error{Op: "Post", Err: timeoutErr{}}, nil, uncertain},
		{"invalid", status.Error(codes.InvalidArgument, "x"), nil, rejected},
		{"unavailable, never written", status.Error(codes.Unavailable, "connection closed"), noted(false, false), keep},
		{"unavailable after the request was written, no answer", status.Error(codes.Unavailable, "error reading from server: EOF"), noted(true, false), uncertain},
		{"unavailable answered by the collector", status.Error(codes.Unavailable, "memory limiter"), noted(true, true), keep},
		{"a proxy's 503 after the request was written", status.Error(codes.Unavailable, "unexpected HTTP status code received from server: 503 (Service Unavailable)"), noted(true, false), keep},
		{"http EOF after the request was written", &url.Error{Op: "Post", Err: io.EOF}, noted(true, false), uncertain},
		{"http 503 answered", errors.New("retry-able request failure: body: (empty)"), noted(true, true), keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.classify(tc.err, tc.note).res; got != tc.want {
				t.Errorf("classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// timeoutErr is a net.Error that timed out after the request left.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "timeout awaiting response headers" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
