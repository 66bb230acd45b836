package sentryusage

import "net"

// KeptConn is s's idle connection (nil when it keeps none), for the
// black-box tests.
func KeptConn(s *Session) net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kept == nil {
		return nil
	}
	return s.kept.conn
}
