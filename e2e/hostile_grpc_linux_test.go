package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandboxstats/sandboxstats/internal/testenv"
	sandboxstatsv1 "github.com/sandboxstats/sandboxstats/proto/sandboxstats/v1"
)

// limitedBin is a directory whose "statsd" runs the real one with
// RLIMIT_NOFILE set to nofile (prlimit execs it: the pid is statsd's).
func limitedBin(t *testing.T, bin string, nofile int) string {
	t.Helper()
	_, err := os.Stat("/usr/bin/prlimit")
	testenv.Need(t, err == nil, "needs prlimit (util-linux)")
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nexec /usr/bin/prlimit --nofile=%d:%d -- %s \"$@\"\n", nofile, nofile, filepath.Join(bin, "statsd"))
	if err := os.WriteFile(filepath.Join(dir, "statsd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// healthWithin reports whether a fresh connection to sock answers a health
// Check within d.
func healthWithin(sock string, d time.Duration) error {
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// h2Conn is a raw HTTP/2 client connection: frames written as a hostile
// client chooses, the server's frames counted.
type h2Conn struct {
	c       net.Conn
	mu      sync.Mutex
	w       *http2.Framer
	block   []byte // the request headers, hpack-encoded
	refused int    // RST_STREAM REFUSED_STREAM
	resets  int    // other RST_STREAM
	goaway  bool
	answer  map[uint32]int // bytes of HEADERS, CONTINUATION and DATA per stream
	done    chan struct{}
}

func dialH2(t *testing.T, sock, path string) *h2Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "statsd"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	h := &h2Conn{c: c, w: http2.NewFramer(c, nil), block: hb.Bytes(), answer: map[uint32]int{}, done: make(chan struct{})}
	c.Write([]byte(http2.ClientPreface))
	h.w.WriteSettings()
	go h.read()
	return h
}

func (h *h2Conn) read() {
	defer close(h.done)
	r := http2.NewFramer(nil, h.c)
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return
		}
		h.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.w.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.w.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode == http2.ErrCodeRefusedStream {
				h.refused++
			} else {
				h.resets++
			}
		case *http2.GoAwayFrame:
			h.goaway = true
		case *http2.HeadersFrame, *http2.ContinuationFrame, *http2.DataFrame:
			h.answer[f.Header().StreamID] += int(f.Header().Length)
		}
		h.mu.Unlock()
	}
}

// headers opens a stream (headers only, no message).
func (h *h2Conn) headers(id uint32) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.w.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block, EndHeaders: true})
}

// message sends a gRPC message of n bytes on stream id, in 16 KiB frames,
// ignoring flow control.
func (h *h2Conn) message(id uint32, n int) error {
	prefix := []byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	chunk := make([]byte, 16<<10)
	h.mu.Lock()
	err := h.w.WriteData(id, false, prefix)
	h.mu.Unlock()
	for sent := 0; err == nil && sent < n; sent += len(chunk) {
		h.mu.Lock()
		err = h.w.WriteData(id, sent+len(chunk) >= n, chunk[:min(len(chunk), n-sent)])
		h.mu.Unlock()
	}
	return err
}

func (h *h2Conn) counts() (refused, resets int, goaway bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused, h.resets, h.goaway
}

// largestAnswer is the most bytes (headers, trailers and messages) the
// server sent on one stream.
func (h *h2Conn) largestAnswer() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	largest := 0
	for _, n := range h.answer {
		largest = max(largest, n)
	}
	return largest
}

// TestIntegrationHostileReadClients: without gRPC resource limits one
// connection with 300 streams of 4 MiB messages took statsd from 226 MB to
// 1.27 GB, 5,000 header-only streams were accepted, and with 512 descriptors
// 600 idle connections made the lifecycle socket hang. statsd (RLIMIT_NOFILE
// 256) must stay under 64 MiB, its lifecycle socket must answer throughout,
// every answer (gRPC or on a raw stream) and every log line must stay under
// 64 KiB.
func TestIntegrationHostileReadClients(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the statsd binary against hostile clients")
	}
	bin := limitedBin(t, testenv.BuildBinaries(t), 256)
	d := testenv.StartStatsd(t, bin, "--drift-interval", "0")
	path := "/" + sandboxstatsv1.WorkloadStatsService_ServiceDesc.ServiceName + "/StatsWorkload"
	var a answers // the gRPC calls' answers
	var raw []*h2Conn

	t.Run("300 streams of 4 MiB messages", func(t *testing.T) {
		// A client that keeps to the protocol: 300 concurrent calls on one
		// connection, each request just under gRPC's default 4 MiB.
		cc, err := grpc.NewClient("unix://"+d.Stats, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		client := sandboxstatsv1.NewWorkloadStatsServiceClient(cc)
		req := &sandboxstatsv1.StatsWorkloadRequest{ActorUid: strings.Repeat("a", 4<<20-64)}
		var wg sync.WaitGroup
		for range 300 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				r, err := client.StatsWorkload(ctx, req)
				a.note("StatsWorkload with a 4 MiB request", r, err)
			})
		}
		// Raw frames too: 100 streams that ignore flow control.
		h := dialH2(t, d.Stats, path)
		raw = append(raw, h)
		for i := range 100 {
			id := uint32(2*i + 1)
			if h.headers(id) != nil || h.message(id, 4<<20-64) != nil {
				break
			}
		}
		if err := healthWithin(d.Lifecycle, 2*time.Second); err != nil {
			t.Errorf("lifecycle socket: %v", err)
		}
		wg.Wait()
		t.Logf("measured: peak RSS %.1f MiB", float64(peakRSS(t, d))/(1<<20))
	})
	t.Run("5000 header-only streams", func(t *testing.T) {
		h := dialH2(t, d.Stats, path)
		raw = append(raw, h)
		for i := range 5000 {
			if err := h.headers(uint32(2*i + 1)); err != nil {
				break
			}
		}
		time.Sleep(500 * time.Millisecond)
		refused, resets, goaway := h.counts()
		t.Logf("measured: %d refused, %d reset, goaway %v; peak RSS %.1f MiB", refused, resets, goaway, float64(peakRSS(t, d))/(1<<20))
		if accepted := 5000 - refused - resets; accepted > 64 && !goaway {
			t.Errorf("%d header-only streams accepted on one connection", accepted)
		}
		if err := healthWithin(d.Lifecycle, 2*time.Second); err != nil {
			t.Errorf("lifecycle socket: %v", err)
		}
	})
	t.Run("600 idle connections", func(t *testing.T) {
		var idle []net.Conn
		for range 600 {
			c, err := net.Dial("unix", d.Stats)
			if err != nil {
				break
			}
			idle = append(idle, c)
		}
		time.Sleep(200 * time.Millisecond)
		start := time.Now()
		err := healthWithin(d.Lifecycle, 2*time.Second)
		t.Logf("measured: %d idle connections dialled; lifecycle health %v in %v", len(idle), err, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("lifecycle socket with the read socket saturated: %v", err)
		}
		for _, c := range idle {
			c.Close()
		}
		// The read socket serves again once they are gone.
		var rerr error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if rerr = healthWithin(d.Stats, time.Second); rerr == nil {
				break
			}
		}
		if rerr != nil {
			t.Errorf("read socket after the idle connections closed: %v", rerr)
		}
	})
	rss := peakRSS(t, d)
	if rss > maxRSSBytes {
		t.Errorf("statsd peak RSS %d MiB, want under %d MiB", rss>>20, maxRSSBytes>>20)
	}
	a.check(t)
	largestRaw := 0
	for _, h := range raw {
		largestRaw = max(largestRaw, h.largestAnswer())
	}
	if largestRaw > maxAnswerBytes {
		t.Errorf("largest answer on a raw stream %d bytes, want under %d", largestRaw, maxAnswerBytes)
	}
	logSize, lines := checkLog(t, d.Log)
	t.Logf("measured: peak RSS %.1f MiB; %d gRPC answers (%d errors), largest %d bytes; largest raw-stream answer %d bytes; log %d bytes in %d lines",
		float64(rss)/(1<<20), a.n, a.errs, a.largest, largestRaw, logSize, lines)
}
