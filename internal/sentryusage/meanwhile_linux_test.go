package sentryusage

import (
	"context"
	"encoding/json"
	"net"
	"testing"
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
