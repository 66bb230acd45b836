package microvm

// This file is the agent connection as the ttrpc client sees it: a net.Conn
// that follows ttrpc's framing in both directions and cuts the connection
// at the first frame no well-behaved agent sends.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// maxAgentFrameBytes bounds one ttrpc frame from the agent. A StatsContainer
// reply is a few KiB (memory.stat, a few devices); ttrpc's own cap is 4 MiB
// per message, and it discards a larger one by reading it to the end, so a
// header announcing 100 MiB followed by silence would wedge the connection
// and 25 replies of 4 MiB would cost 100s of MiB.
const maxAgentFrameBytes = 256 << 10

// ttrpcMaxMessage is ttrpc's own cap on a message (channel.go).
const ttrpcMaxMessage = 4 << 20

// ttrpc framing (github.com/containerd/ttrpc channel.go, PROTOCOL.md).
const (
	frameHeaderBytes  = 10
	frameTypeRequest  = 0x1
	frameTypeResponse = 0x2
)

// errHostileFrame marks a connection cut because of what the agent sent;
// its errors also wrap source.ErrMalformed: the agent answered, wrongly.
var errHostileFrame = errors.New("microvm: the agent sent a frame statsd refuses")

// frameGuard wraps the agent connection. It notes the stream id of every
// request the client writes and checks every frame the agent sends: a frame
// longer than its cap (Config.MaxFrameBytes), a frame for a stream with no
// request outstanding (ttrpc would log each one and drop it: an agent
// streaming them made 85 MB of logs in 10 s), any frame but a response, or
// a response whose envelope holds more than envelopeBudget (ttrpc decodes
// the status and its details before any interceptor sees the reply: 131,000
// empty details in one frame cost 43-50 ms and 32 MB) fails the read, before
// ttrpc has the frame's last byte, and closes the connection, so the ttrpc
// client ends and the source redials with backoff.
//
// Every write has a deadline, writeBound from its start, when the
// connection takes one: an agent that takes no request bytes for that long
// (a guest that gives no vsock credit) has its connection cut, and so no
// call blocks past its own bound in the write.
type frameGuard struct {
	net.Conn

	maxFrame uint32
	// writeBound bounds each write; 0 if the connection refused a write
	// deadline (then a write may block until the connection closes).
	writeBound time.Duration

	mu          sync.Mutex
	outstanding map[uint32]bool // requests written, no response read yet
	violation   error

	rd, wr frameParser // each used by one goroutine: ttrpc's reader, and its writer under its send lock
	body   []byte      // the incoming frame's payload so far (ttrpc's reader only), at most maxFrame
}

func newFrameGuard(c net.Conn, maxFrame int, writeBound time.Duration) *frameGuard {
	g := &frameGuard{Conn: c, maxFrame: uint32(maxFrame), outstanding: make(map[uint32]bool)}
	if c.SetWriteDeadline(time.Time{}) == nil {
		g.writeBound = writeBound
	}
	return g
}

// Violation is why the guard cut the connection, or nil.
func (g *frameGuard) Violation() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.violation
}

func (g *frameGuard) Write(p []byte) (int, error) {
	// Note the requests before their bytes leave: the reply may race back.
	g.wr.feed(p, func(h frameHeader) error {
		if h.typ == frameTypeRequest {
			g.mu.Lock()
			g.outstanding[h.stream] = true
			g.mu.Unlock()
		}
		return nil
	}, nil)
	if g.writeBound <= 0 {
		return g.Conn.Write(p)
	}
	if err := g.Conn.SetWriteDeadline(time.Now().Add(g.writeBound)); err != nil {
		return 0, err
	}
	n, err := g.Conn.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// A frame cut anywhere leaves the stream unusable: cut it all.
		verr := fmt.Errorf("%w: the agent took no request bytes for %s (%d of a %d-byte write taken)", source.ErrTimeout, g.writeBound, n, len(p))
		g.mu.Lock()
		if g.violation == nil {
			g.violation = verr
		}
		g.mu.Unlock()
		g.Conn.Close()
		return n, verr
	}
	return n, err
}

func (g *frameGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if n > 0 {
		if verr := g.rd.feed(p[:n], g.checkIncoming, g.checkBody); verr != nil {
			g.mu.Lock()
			if g.violation == nil {
				g.violation = verr
			}
			g.mu.Unlock()
			g.Conn.Close()
			return 0, verr
		}
	}
	return n, err
}

func (g *frameGuard) checkIncoming(h frameHeader) error {
	switch {
	case h.length > g.maxFrame:
		return fmt.Errorf("%w: %w: a frame of %d bytes on stream %d (at most %d accepted)", source.ErrMalformed, errHostileFrame, h.length, h.stream, g.maxFrame)
	case h.typ != frameTypeResponse:
		return fmt.Errorf("%w: %w: a frame of type %d on stream %d (only responses to unary calls are expected)", source.ErrMalformed, errHostileFrame, h.typ, h.stream)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.outstanding[h.stream] {
		return fmt.Errorf("%w: %w: a response on stream %d, which has no request outstanding", source.ErrMalformed, errHostileFrame, h.stream)
	}
	delete(g.outstanding, h.stream)
	return nil
}

// checkBody collects a response's payload and, at its last byte, checks
// its envelope against envelopeBudget.
func (g *frameGuard) checkBody(h frameHeader, chunk []byte, last bool) error {
	if len(g.body) == 0 && cap(g.body) < int(h.length) {
		g.body = make([]byte, 0, h.length) // at most the frame cap: checkIncoming ran first
	}
	g.body = append(g.body, chunk...)
	if !last {
		return nil
	}
	// The buffer is kept for the next frame (at most the frame cap, one
	// per connection): a buffer a frame cost a third of the reading of
	// replies near the cap.
	_, err := countReply(g.body, envelopeDescriptor, envelopeBudget)
	g.body = g.body[:0]
	if err != nil {
		return fmt.Errorf("%w: %w: the response on stream %d: %w", source.ErrMalformed, errHostileFrame, h.stream, err)
	}
	return nil
}

// frameHeader is ttrpc's 10-byte frame header.
type frameHeader struct {
	length, stream uint32
	typ, flags     byte
}

// frameParser follows frame boundaries across arbitrary chunks of a byte
// stream: it assembles each header and passes over each payload.
type frameParser struct {
	hdr  [frameHeaderBytes]byte
	have int         // header bytes assembled
	cur  frameHeader // the frame whose payload is passing
	skip uint32      // payload bytes still to pass
}

// feed consumes a chunk, calling onHeader for every complete header and,
// if onBody is not nil, onBody for every piece of a payload (last: the
// payload ends with it; an empty payload is one empty last piece); it stops
// at the first error either returns.
func (f *frameParser) feed(p []byte, onHeader func(frameHeader) error, onBody func(h frameHeader, chunk []byte, last bool) error) error {
	for len(p) > 0 {
		if f.skip > 0 {
			n := min(uint32(len(p)), f.skip)
			f.skip -= n
			if onBody != nil {
				if err := onBody(f.cur, p[:n], f.skip == 0); err != nil {
					return err
				}
			}
			p = p[n:]
			continue
		}
		n := copy(f.hdr[f.have:], p)
		f.have += n
		p = p[n:]
		if f.have < frameHeaderBytes {
			return nil
		}
		f.have = 0
		h := frameHeader{
			length: binary.BigEndian.Uint32(f.hdr[0:4]),
			stream: binary.BigEndian.Uint32(f.hdr[4:8]),
			typ:    f.hdr[8],
			flags:  f.hdr[9],
		}
		if err := onHeader(h); err != nil {
			return err
		}
		f.cur, f.skip = h, h.length
		if h.length == 0 && onBody != nil {
			if err := onBody(h, nil, true); err != nil {
				return err
			}
		}
	}
	return nil
}
