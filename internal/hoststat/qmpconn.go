package hoststat

// This file is one QMP session on the wire: line-delimited JSON, every read
// bounded in size, in count of events skipped and in bytes per session, so
// that a peer on the QMP socket (QEMU, or whatever bound that path) sets
// neither the time nor the memory of a host sample.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// Bounds of a QMP session. query-stats of a large VM with histograms is the
// largest message (hundreds of KiB for 64 vCPUs); QEMU's greeting is a few
// hundred bytes; QEMU sends a handful of events at most between two
// replies.
const (
	maxQMPMessage       = 4 << 20
	maxQMPGreeting      = 64 << 10
	maxQMPEventsPerCall = 16
	maxQMPSessionBytes  = 8 << 20
)

// qmpConn is one QMP session over a Unix socket.
type qmpConn struct {
	c   net.Conn
	rd  *bufio.Reader
	lim *io.LimitedReader // what the session may still read
	buf bytes.Buffer      // the current message, reused
}

func newQMPConn(c net.Conn) *qmpConn {
	lim := &io.LimitedReader{R: c, N: maxQMPSessionBytes}
	return &qmpConn{c: c, rd: bufio.NewReaderSize(lim, 64<<10), lim: lim}
}

// qmpMessage holds the members of a QMP message statsd looks at; anything
// else in it (an event's data) is skipped by the decoder, never copied.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  json.RawMessage `json:"event"`
	Error  json.RawMessage `json:"error"`
	Return json.RawMessage `json:"return"`
}

// readMessage reads one JSON line of at most max bytes.
func (q *qmpConn) readMessage(max int) (qmpMessage, error) {
	q.buf.Reset()
	for {
		chunk, err := q.rd.ReadSlice('\n')
		if q.buf.Len()+len(chunk) > max {
			return qmpMessage{}, fmt.Errorf("%w: qmp message longer than %d bytes", source.ErrMalformed, max)
		}
		q.buf.Write(chunk)
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) && q.lim.N <= 0 {
			return qmpMessage{}, fmt.Errorf("%w: qmp session longer than %d bytes", source.ErrMalformed, maxQMPSessionBytes)
		}
		return qmpMessage{}, err
	}
	var m qmpMessage
	if err := json.Unmarshal(q.buf.Bytes(), &m); err != nil {
		return qmpMessage{}, fmt.Errorf("%w: qmp message %s: %w", source.ErrMalformed, foreign.QuoteBytes(q.buf.Bytes()), err)
	}
	return m, nil
}

// execute sends a command and returns its "return" value, skipping at most
// maxQMPEventsPerCall asynchronous events that arrive first.
func (q *qmpConn) execute(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send %s: %w", cmd, err)
	}
	for events := 0; ; events++ {
		if events > maxQMPEventsPerCall {
			return nil, fmt.Errorf("%w: %s: more than %d events before the reply", source.ErrMalformed, cmd, maxQMPEventsPerCall)
		}
		m, err := q.readMessage(maxQMPMessage)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd, err)
		}
		switch {
		case m.Event != nil:
			continue
		case m.Error != nil:
			return nil, fmt.Errorf("%s: qmp error %s", cmd, foreign.QuoteBytes(m.Error))
		case m.Return != nil:
			return m.Return, nil
		}
		return nil, fmt.Errorf("%w: %s: reply has neither return nor error", source.ErrMalformed, cmd)
	}
}
