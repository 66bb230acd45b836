package sentryusage

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unixPathMax is sizeof(sockaddr_un.sun_path).
const unixPathMax = 108

// dialUnix connects to a Unix stream socket: a path, or an abstract name
// written @name. A path too long for sun_path is opened O_PATH and
// connected through /proc/self/fd/N, as runsc's own sandboxConnect does.
func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if !strings.HasPrefix(addr, "@") && len(addr) >= unixPathMax {
		fd, err := unix.Open(addr, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: addr, Err: err}
		}
		defer unix.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	return d.DialContext(ctx, "unix", addr)
}
