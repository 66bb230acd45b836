package microvm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrAddress is wrapped by every agent-address parse error.
var ErrAddress = errors.New("microvm: bad agent address")

// Scheme is the transport of an agent address.
type Scheme int

const (
	// SchemeHybridVsock is "hvsock://<unix socket path>:<port>": a Unix socket
	// of the VMM (Cloud Hypervisor, Firecracker) that forwards to a guest
	// vsock port after a CONNECT handshake.
	SchemeHybridVsock Scheme = iota + 1
	// SchemeVsock is "vsock://<cid>:<port>" (QEMU vhost-vsock).
	SchemeVsock
)

// Address is a parsed guest agent address.
type Address struct {
	Scheme Scheme
	Path   string // hybrid vsock: the VMM's Unix socket
	CID    uint32 // vsock: the guest's context id
	Port   uint32 // the guest vsock port the agent listens on (normally 1024)
}

// String formats a in the form ParseAddress reads.
func (a Address) String() string {
	switch a.Scheme {
	case SchemeHybridVsock:
		return fmt.Sprintf("hvsock://%s:%d", a.Path, a.Port)
	case SchemeVsock:
		return fmt.Sprintf("vsock://%d:%d", a.CID, a.Port)
	default:
		return "invalid agent address"
	}
}

// vsock context ids below 3 are the hypervisor, the local machine and the
// host; 0xFFFFFFFF is "any". None of them is a guest.
const (
	minGuestCID = 3
	cidAny      = 0xFFFFFFFF
	portAny     = 0xFFFFFFFF
)

// ParseAddress reads an agent address: "hvsock://<absolute unix socket
// path>:<port>" or "vsock://<cid>:<port>". The port follows the last colon,
// so a socket path may contain colons. It is pure: nothing is dialled.
func ParseAddress(s string) (Address, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return Address{}, fmt.Errorf("%w %q: want hvsock://<unix socket>:<port> or vsock://<cid>:<port>", ErrAddress, s)
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return Address{}, fmt.Errorf("%w %q: no :<port> after the %s target", ErrAddress, s, scheme)
	}
	target, portText := rest[:i], rest[i+1:]
	port, err := parseDecimalUint32(portText)
	if err != nil {
		return Address{}, fmt.Errorf("%w %q: port %q: %w", ErrAddress, s, portText, err)
	}
	if port == 0 || port == portAny {
		return Address{}, fmt.Errorf("%w %q: port %d is not a listening port", ErrAddress, s, port)
	}
	switch scheme {
	case "hvsock":
		if !strings.HasPrefix(target, "/") {
			return Address{}, fmt.Errorf("%w %q: socket path %q is not absolute", ErrAddress, s, target)
		}
		if strings.ContainsRune(target, 0) {
			return Address{}, fmt.Errorf("%w %q: socket path contains NUL", ErrAddress, s)
		}
		return Address{Scheme: SchemeHybridVsock, Path: target, Port: port}, nil
	case "vsock":
		cid, err := parseDecimalUint32(target)
		if err != nil {
			return Address{}, fmt.Errorf("%w %q: cid %q: %w", ErrAddress, s, target, err)
		}
		if cid < minGuestCID || cid == cidAny {
			return Address{}, fmt.Errorf("%w %q: cid %d is not a guest (guests have cid >= 3)", ErrAddress, s, cid)
		}
		return Address{Scheme: SchemeVsock, CID: cid, Port: port}, nil
	default:
		return Address{}, fmt.Errorf("%w %q: scheme %q not supported (want hvsock or vsock)", ErrAddress, s, scheme)
	}
}

// parseDecimalUint32 reads canonical ASCII decimal: no sign, no spaces, no base
// prefix, no leading zeros.
func parseDecimalUint32(s string) (uint32, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, errors.New("leading zero")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("byte %q is not a decimal digit", s[i])
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, err
	}
	return uint32(n), nil
}
