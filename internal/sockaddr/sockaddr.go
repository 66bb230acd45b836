package sockaddr

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrAddress is wrapped by every error of Parse.
var ErrAddress = errors.New("sockaddr: not a Unix socket address")

// Spellings is what Parse accepts, for error and help texts.
const Spellings = "a path, unix:PATH or unix:///PATH"

// Parse returns the file system path of a Unix socket address given as a
// path, unix:PATH or unix:///PATH (see the package documentation); the
// "unix" scheme is case-insensitive, nothing is percent-decoded. It rejects
// an empty address or path, a NUL byte, unix://HOST/PATH (an authority) and
// any other scheme, naming it. A relative path whose first element has a
// colon ("a:b.sock") reads as a scheme: write it ./a:b.sock or unix:a:b.sock.
func Parse(addr string) (string, error) {
	if addr == "" {
		return "", fmt.Errorf("%w: empty (want %s)", ErrAddress, Spellings)
	}
	if strings.IndexByte(addr, 0) >= 0 {
		return "", fmt.Errorf("%w: %q has a NUL byte", ErrAddress, addr)
	}
	scheme, rest, ok := splitScheme(addr)
	if !ok {
		return addr, nil // a plain path
	}
	if !strings.EqualFold(scheme, "unix") {
		return "", fmt.Errorf("%w: %q: scheme %q is not supported, only Unix sockets (%s)", ErrAddress, addr, scheme, Spellings)
	}
	path := rest
	if after, isURL := strings.CutPrefix(rest, "//"); isURL {
		if !strings.HasPrefix(after, "/") {
			return "", fmt.Errorf("%w: %q: unix:// takes an absolute path and no host (unix:///run/x.sock, or unix:relative/x.sock)", ErrAddress, addr)
		}
		path = after
	}
	if path == "" {
		return "", fmt.Errorf("%w: %q has no path (want %s)", ErrAddress, addr, Spellings)
	}
	return path, nil
}

// splitScheme splits "scheme:rest" where scheme is an RFC 3986 scheme
// (a letter, then letters, digits, +, - or .). A path starting with / or .
// never has one.
func splitScheme(addr string) (scheme, rest string, ok bool) {
	i := strings.IndexByte(addr, ':')
	if i <= 0 {
		return "", "", false
	}
	for j, r := range addr[:i] {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case j > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return "", "", false
		}
	}
	return addr[:i], addr[i+1:], true
}

// Target returns the gRPC dial target of a Unix socket path, made absolute
// (gRPC's unix:// takes an absolute path only).
func Target(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("sockaddr: %q: %w", path, err)
	}
	return "unix://" + abs, nil
}

// Flag is a flag.Value over a Unix socket path: Set accepts what Parse
// accepts and stores the path; String is the path. Preset *Path to the
// default.
type Flag struct{ Path *string }

// String returns the path ("" for the zero Flag).
func (f Flag) String() string {
	if f.Path == nil {
		return ""
	}
	return *f.Path
}

// Set parses addr and stores its path.
func (f Flag) Set(addr string) error {
	p, err := Parse(addr)
	if err != nil {
		return err
	}
	*f.Path = p
	return nil
}
