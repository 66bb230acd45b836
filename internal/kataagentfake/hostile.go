// This file is a hostile guest agent: it writes raw ttrpc frames, so that
// it can do what no ttrpc server does (frames for streams no call opened, a
// header announcing 100 MiB and then silence).

package kataagentfake

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	katagrpc "github.com/sandboxstats/sandboxstats/proto/kata/grpc"
)

// Hostility is what a Hostile agent does with StatsContainer.
type Hostility int

const (
	// Behave answers every StatsContainer with the scripted reply.
	Behave Hostility = iota
	// FloodInactiveStreams answers Version, then sends empty response
	// frames on stream ids no call opened (even ids: the client's are
	// odd), as fast as the connection takes them, until it breaks.
	FloodInactiveStreams
	// HugeHeader answers StatsContainer with a frame header announcing a
	// 100 MiB response, then sends nothing more.
	HugeHeader
	// Silent reads StatsContainer and never answers.
	Silent
	// ErrorStatus answers every StatsContainer with an error status
	// carrying the scripted message.
	ErrorStatus
)

// Hostile is a running hostile agent on a Unix socket (hybrid vsock).
type Hostile struct {
	path string

	mu      sync.Mutex
	mode    Hostility
	reply   *katagrpc.StatsContainerResponse
	errMsg  string
	ln      net.Listener
	conns   map[net.Conn]bool
	dials   int
	stopped bool
	wg      sync.WaitGroup

	flooded atomic.Int64 // frames sent on streams no call opened
}

// NewHostile starts a hostile agent in dir answering StatsContainer with
// reply while it behaves; t.Cleanup stops it.
func NewHostile(tb testing.TB, dir string, mode Hostility, reply *katagrpc.StatsContainerResponse) *Hostile {
	tb.Helper()
	h := &Hostile{path: filepath.Join(dir, "hostile.hvsock"), mode: mode, reply: reply, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("unix", h.path)
	if err != nil {
		tb.Fatalf("kataagentfake: listen %s: %v", h.path, err)
	}
	h.ln = ln
	h.wg.Add(1)
	go h.accept()
	tb.Cleanup(h.Stop)
	return h
}

// Address is the agent address for a SandboxRef.
func (h *Hostile) Address() string { return fmt.Sprintf("hvsock://%s:%d", h.path, DefaultPort) }

// SetMode changes what the agent does from the next request (or
// connection, for FloodInactiveStreams) on.
func (h *Hostile) SetMode(m Hostility) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mode = m
}

// SetErrorMessage sets the message of ErrorStatus answers.
func (h *Hostile) SetErrorMessage(msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errMsg = msg
}

// Dials is how many connections were accepted.
func (h *Hostile) Dials() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dials
}

// Flooded is how many frames were sent on streams no call opened.
func (h *Hostile) Flooded() int64 { return h.flooded.Load() }

// Stop closes the listener and every connection.
func (h *Hostile) Stop() {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return
	}
	h.stopped = true
	h.ln.Close()
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
	os.Remove(h.path)
}

func (h *Hostile) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.conns[c] = true
		h.dials++
		h.mu.Unlock()
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.serve(c)
			c.Close()
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
		}()
	}
}

// serve answers CONNECT, then reads request frames and answers each as the
// mode says.
func (h *Hostile) serve(c net.Conn) {
	if line, err := readLine(c); err != nil || line != fmt.Sprintf("CONNECT %d\n", DefaultPort) {
		return
	}
	if _, err := fmt.Fprintf(c, "OK %d\n", hostPortBase); err != nil {
		return
	}
	var wmu sync.Mutex
	write := func(stream uint32, length int, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		var hdr [frameHeaderLen]byte
		binary.BigEndian.PutUint32(hdr[0:4], uint32(length))
		binary.BigEndian.PutUint32(hdr[4:8], stream)
		hdr[8] = 0x2 // response
		if _, err := c.Write(hdr[:]); err != nil {
			return err
		}
		_, err := c.Write(payload)
		return err
	}
	respond := func(stream uint32, r *ttrpc.Response) error {
		b, err := proto.Marshal(r)
		if err != nil {
			return err
		}
		return write(stream, len(b), b)
	}
	wedged := false // after a huge header: nothing more is ever sent
	for {
		var hdr [frameHeaderLen]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		length, stream := binary.BigEndian.Uint32(hdr[0:4]), binary.BigEndian.Uint32(hdr[4:8])
		if length > frameLengthMax {
			return
		}
		buf := make([]byte, length)
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		var req ttrpc.Request
		if hdr[8] != frameTypeRequest || proto.Unmarshal(buf, &req) != nil {
			return
		}
		h.mu.Lock()
		mode, reply, errMsg := h.mode, h.reply, h.errMsg
		h.mu.Unlock()
		var err error
		switch {
		case wedged:
		case req.GetService() == "grpc.Health" && req.GetMethod() == "Version":
			p, _ := proto.Marshal(&katagrpc.VersionCheckResponse{GrpcVersion: "0.0.1", AgentVersion: "3.9.0"})
			err = respond(stream, &ttrpc.Response{Payload: p})
			if err == nil && mode == FloodInactiveStreams {
				h.wg.Add(1)
				go func() {
					defer h.wg.Done()
					for id := uint32(2); ; id += 2 {
						if write(id, 0, nil) != nil {
							return
						}
						h.flooded.Add(1)
					}
				}()
			}
		case mode == HugeHeader:
			err, wedged = write(stream, 100<<20, nil), true
		case mode == Silent:
		case mode == ErrorStatus:
			err = respond(stream, &ttrpc.Response{Status: status.New(codes.Internal, errMsg).Proto()})
		default:
			p, _ := proto.Marshal(reply)
			err = respond(stream, &ttrpc.Response{Payload: p})
		}
		if err != nil {
			return
		}
	}
}
