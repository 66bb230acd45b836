package nrifake

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"
)

// Silent is a hostile NRI runtime side: it accepts each plugin's
// connection and registration (RegisterPlugin answers at once) and never
// configures it, so a plugin's start waits for a Configure that does not
// come.
type Silent struct {
	// Socket is where plugins connect.
	Socket string
	ln     net.Listener

	mu      sync.Mutex
	conns   []net.Conn
	servers []*ttrpc.Server
	regs    int
	done    bool
	wg      sync.WaitGroup
}

// StartSilent serves a Silent runtime on dir/nri.sock until the test ends
// or Stop.
func StartSilent(t testing.TB, dir string) *Silent {
	t.Helper()
	s := &Silent{Socket: filepath.Join(dir, "nri.sock")}
	ln, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	s.wg.Go(s.accept)
	t.Cleanup(s.Stop)
	return s
}

// Registrations is how many plugins registered so far.
func (s *Silent) Registrations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.regs
}

func (s *Silent) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		// As the adaptation does: the runtime's service on the plugin's
		// multiplexed connection, whose RegisterPlugin is all it answers.
		srv, err := ttrpc.NewServer()
		if err != nil {
			c.Close()
			continue
		}
		// The plugin gone (its end closed), the server ends: the mux does
		// not close its listeners by itself.
		mux := multiplex.Multiplex(&closeOnEOF{Conn: c, close: func() { srv.Close() }})
		l, err := mux.Listen(multiplex.RuntimeServiceConn)
		if err != nil {
			c.Close()
			continue
		}
		api.RegisterRuntimeService(srv, silentService{s})
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns, s.servers = append(s.conns, c), append(s.servers, srv)
		s.mu.Unlock()
		s.wg.Go(func() {
			_ = srv.Serve(context.Background(), l)
			mux.Close()
		})
	}
}

// Stop closes the socket and every connection, and waits for their
// servers to end.
func (s *Silent) Stop() {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.done = true
	s.ln.Close()
	for _, c := range s.conns {
		c.Close()
	}
	for _, srv := range s.servers {
		srv.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

type silentService struct{ s *Silent }

func (r silentService) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.s.regs++
	return &api.Empty{}, nil
}

func (r silentService) UpdateContainers(context.Context, *api.UpdateContainersRequest) (*api.UpdateContainersResponse, error) {
	return &api.UpdateContainersResponse{}, nil
}

// closeOnEOF calls close once a read fails: the peer closed.
type closeOnEOF struct {
	net.Conn
	once  sync.Once
	close func()
}

func (c *closeOnEOF) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(c.close)
	}
	return n, err
}
