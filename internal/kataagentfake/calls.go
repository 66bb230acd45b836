package kataagentfake

import (
	"encoding/binary"
	"maps"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
)

// ttrpc framing (containerd/ttrpc channel.go): a 10-byte header (payload
// length, stream id, type, flags), then the payload; a request's payload is
// a ttrpc.Request naming the service and method.
const (
	frameHeaderLen   = 10
	frameTypeRequest = 0x1
	frameLengthMax   = 4 << 20
)

// requestCounter reads the ttrpc byte stream a client sends and reports
// every request frame's "/service/method". It sees what the client asked,
// whether or not the fake serves the method (ttrpc answers Unimplemented for
// an unregistered one before any handler runs), so a test can prove that a
// client never called, say, GetOOMEvent.
type requestCounter struct {
	onRequest func(method string)

	hdr     [frameHeaderLen]byte
	nhdr    int    // header bytes seen of the current frame
	left    int    // payload bytes of the current frame still to come
	request bool   // the current frame is a request
	payload []byte // a request's payload so far
	broken  bool   // the stream stopped looking like ttrpc: count no more
}

// feed consumes the next bytes of the stream.
func (r *requestCounter) feed(b []byte) {
	for len(b) > 0 && !r.broken {
		if r.nhdr < frameHeaderLen {
			n := copy(r.hdr[r.nhdr:], b)
			r.nhdr += n
			b = b[n:]
			if r.nhdr < frameHeaderLen {
				return
			}
			length := binary.BigEndian.Uint32(r.hdr[:4])
			if length > frameLengthMax {
				r.broken = true
				return
			}
			r.left = int(length)
			r.request = r.hdr[8] == frameTypeRequest
			r.payload = r.payload[:0]
			if r.left == 0 {
				r.frameDone()
			}
			continue
		}
		n := min(r.left, len(b))
		if r.request {
			r.payload = append(r.payload, b[:n]...)
		}
		r.left -= n
		b = b[n:]
		if r.left == 0 {
			r.frameDone()
		}
	}
}

func (r *requestCounter) frameDone() {
	if r.request {
		var req ttrpc.Request
		if proto.Unmarshal(r.payload, &req) == nil {
			r.onRequest("/" + req.GetService() + "/" + req.GetMethod())
		} else {
			r.onRequest("(undecodable request)")
		}
	}
	r.nhdr, r.left, r.request = 0, 0, false
}

// countRequest records one request the fake received.
func (a *Agent) countRequest(method string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls[method]++
}

// Calls reports every request the fake received, by ttrpc method path
// ("/grpc.AgentService/StatsContainer", "/grpc.Health/Version", ...),
// counted from the wire: methods the fake does not serve are counted too.
func (a *Agent) Calls() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.calls)
}
