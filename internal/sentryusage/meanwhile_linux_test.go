package sentryusage

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestReadMeanwhile: Query.Meanwhile runs once per Read, after the request
// is written and before the reply is read (the sentry, here, waits for it
// to run before it answers), also when the Read writes twice (an old runsc
// refusing the id form); a Read that writes nothing never calls it.
func TestReadMeanwhile(t *testing.T) {
	fx := getFixtures(t)
	cases := []struct {
		name   string
		behave func(json.RawMessage, net.Conn)
		calls  int
		err    bool
	}{
		{name: "one request", behave: newRunsc(fx), calls: 1},
		{name: "two requests (the other argument form)", behave: oldRunsc(fx), calls: 1},
		{name: "no socket: nothing written", calls: 0, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			ran := make(chan struct{}, 8)
			if tc.behave != nil {
				startFake(t, sockIn(root, busy1.SandboxID), func(arg json.RawMessage, c net.Conn) {
					<-ran // answered only once Meanwhile ran: it runs before the reply is read
					ran <- struct{}{}
					tc.behave(arg, c)
				})
			}
			c := newClient(t, Config{RootDirs: []string{root}})
			calls := 0
			q := busy1
			q.Meanwhile = func() { calls++; ran <- struct{}{} }
			_, err := c.Read(context.Background(), q)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if calls != tc.calls {
				t.Errorf("Meanwhile ran %d times, want %d", calls, tc.calls)
			}
		})
	}
}

// TestMeanwhileNotTheSentrysTime: statsd's own read (Meanwhile) does not eat
// the sentry's reply deadline (review F5): a sentry that answers at once is
// read although Meanwhile outlasts the Timeout; when the context's deadline
// leaves no room, the deadline's error names statsd's own read.
func TestMeanwhileNotTheSentrysTime(t *testing.T) {
	fx := getFixtures(t)
	const timeout = 300 * time.Millisecond // the dial and the write fit in it on a loaded machine
	for _, tc := range []struct {
		name    string
		ctxFor  time.Duration // 0: no deadline of its own
		wantErr string
	}{
		{name: "Meanwhile past the Timeout: the reply read"},
		{name: "the context's deadline passed meanwhile", ctxFor: 2 * timeout, wantErr: "statsd's own read took"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			startFake(t, sockIn(root, busy1.SandboxID), newRunsc(fx))
			c := newClient(t, Config{RootDirs: []string{root}, Timeout: timeout})
			q := busy1
			q.Meanwhile = func() { time.Sleep(3 * timeout) }
			ctx := context.Background()
			if tc.ctxFor > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxFor)
				defer cancel()
			}
			_, err := c.Read(ctx, q)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Read: %v; want the reply the sentry sent at once", err)
			case tc.wantErr != "" && (!errors.Is(err, ErrDeadline) || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Read: %v; want ErrDeadline saying %q", err, tc.wantErr)
			}
		})
	}
}
