package microvm

import "github.com/sandboxstats/sandboxstats/internal/source"

// The agent address syntax is shared with lifecycle validation
// (internal/identity), so that an address statsd accepts is one this package
// can dial; it lives in internal/source.
type (
	// Address is a parsed agent address.
	Address = source.AgentAddress
	// Scheme is the transport of an agent address.
	Scheme = source.AgentScheme
)

// Schemes of an agent address.
const (
	SchemeHybridVsock = source.SchemeHybridVsock
	SchemeVsock       = source.SchemeVsock
)

// ErrAddress is wrapped by every agent-address parse error.
var ErrAddress = source.ErrAgentAddress

// ParseAddress reads "hvsock://<absolute unix socket path>:<port>" or
// "vsock://<cid>:<port>"; see source.ParseAgentAddress.
func ParseAddress(s string) (Address, error) { return source.ParseAgentAddress(s) }
