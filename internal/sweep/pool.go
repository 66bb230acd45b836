package sweep

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc/codes"
)

// Pool sweeps as Config does, but keeps one connection per daemon across
// sweeps instead of dialing each daemon at every poll: a new gRPC
// connection (a dial, the HTTP/2 handshake, its goroutines) costs the
// poller several times what the call on it does.
//
// A connection is kept for the socket's path and its file (device, inode
// and modification time): a socket replaced since (a restarted daemon binds
// a new one) gets a new connection. A connection is closed when a poll on
// it fails (any error: the next sweep dials afresh, as a poller without a
// Pool would), when its socket vanished, and when a sweep is not given its
// socket. A kept connection that broke unnoticed (Unavailable) is replaced
// by a fresh one within the same poll, so that keeping connections fails
// no poll a fresh connection would have answered. Every
// connection the Pool makes, and every reconnect, checks the server's uid
// (SO_PEERCRED) as Config's polls do; timeouts, limits and the sweep's
// bound are Config's.
//
// Sweeps of one Pool run one at a time. Close it when done.
type Pool struct {
	cfg Config
	p   poller

	sweeping sync.Mutex // one Sweep or PollAll at a time
	mu       sync.Mutex // guards conns
	conns    map[string]*daemonConn
}

// NewPool returns a Pool polling under c. It holds no connection until its
// first sweep.
func (c Config) NewPool() *Pool {
	return &Pool{cfg: c, p: c.poller(), conns: make(map[string]*daemonConn)}
}

// Sweep discovers the daemons matching glob (DiscoverAllowed with
// c.AllowUIDs) and polls them (PollAll), as Config.Sweep does.
func (p *Pool) Sweep(ctx context.Context, glob string) ([]DaemonResult, error) {
	d, err := DiscoverAllowed(glob, p.cfg.AllowUIDs)
	if err != nil {
		return nil, err
	}
	return p.PollAll(ctx, d.Sockets), nil
}

// PollAll polls the given sockets as Config.PollAll does, on the
// connections the Pool keeps, then closes the connections of sockets not
// among them.
func (p *Pool) PollAll(ctx context.Context, sockets []string) []DaemonResult {
	p.sweeping.Lock()
	defer p.sweeping.Unlock()
	results := p.cfg.pollAll(ctx, sockets, p.poll)
	given := make(map[string]bool, len(sockets))
	for _, s := range sockets {
		if abs, err := filepath.Abs(s); err == nil {
			given[abs] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for abs, dc := range p.conns {
		if !given[abs] {
			dc.cc.Close()
			delete(p.conns, abs)
		}
	}
	return results
}

// Close closes every connection the Pool keeps. The Pool can sweep again
// after it (dialing afresh).
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for abs, dc := range p.conns {
		errs = append(errs, dc.cc.Close())
		delete(p.conns, abs)
	}
	return errors.Join(errs...)
}

// socketFile identifies a socket file: its device and inode, and when it
// was made (its modification time: a socket bound anew where one was
// removed may get the inode again, not the time).
type socketFile struct {
	fileID
	modUnixNano int64
}

// poll polls the daemon at socket on its kept connection, made first if it
// has none, or none to the socket file there now.
func (p *Pool) poll(ctx context.Context, socket string) DaemonResult {
	abs, err := filepath.Abs(socket) // "unix://" needs an absolute path
	if err != nil {
		return failed(socket, err)
	}
	var id socketFile
	fi, err := os.Lstat(abs)
	ok := err == nil
	if ok {
		id.fileID, _, ok = fileOwner(fi)
		id.modUnixNano = fi.ModTime().UnixNano()
	}
	if !ok {
		// Gone since discovery: its connection is closed, and a fresh one
		// fails and classifies it (vanished).
		p.drop(abs, nil)
		return p.p.pollOnce(ctx, socket)
	}
	dc, reused, err := p.conn(abs, id)
	if err != nil {
		return failed(socket, err)
	}
	r := p.p.poll(ctx, socket, dc)
	if reused && r.Status == StatusError && r.Code == codes.Unavailable {
		// The kept connection broke since the last sweep and gRPC had not
		// noticed yet (the daemon restarted a moment ago): once more on a
		// fresh one, as a poll without a Pool would have dialed.
		p.drop(abs, dc)
		if dc, _, err = p.conn(abs, id); err != nil {
			return failed(socket, err)
		}
		r = p.p.poll(ctx, socket, dc)
	}
	// A busy statsd's refusal (TOO_MANY_READS) came over a sound
	// connection: kept (dialing again in a reader's storm would compete
	// with the reader for the daemon's connections).
	if r.Status == StatusError && !tooManyReads(r.Err) || r.Status == StatusVanished {
		p.drop(abs, dc)
	}
	return r
}

// conn returns the connection kept for the socket file id at abs, and
// whether it was kept from before; it closes one kept for another file
// there (a replaced socket) and makes a new one.
func (p *Pool) conn(abs string, id socketFile) (dc *daemonConn, reused bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dc := p.conns[abs]; dc != nil {
		if dc.id == id {
			return dc, true, nil
		}
		dc.cc.Close()
		delete(p.conns, abs)
	}
	if dc, err = p.p.dial(abs, id); err != nil {
		return nil, false, err
	}
	p.conns[abs] = dc
	return dc, false, nil
}

// drop closes dc, a connection to abs a poll failed on (nil: the one kept
// for abs, if any), and forgets it.
func (p *Pool) drop(abs string, dc *daemonConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.conns[abs]
	if dc == nil {
		dc = kept
	}
	if dc == nil {
		return
	}
	if kept == dc {
		delete(p.conns, abs)
	}
	dc.cc.Close()
}
