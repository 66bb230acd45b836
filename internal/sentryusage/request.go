package sentryusage

import (
	"encoding/json"
	"fmt"
)

// requestPrefix is every request's beginning: the method is fixed here, in
// the bytes, and nowhere else.
const requestPrefix = `{"method":"` + Method + `","arg":`

// encodeRequest returns the one request this package sends: Method with
// the container id as its argument (DialectContainerID) or null
// (DialectNoArg, and DialectUnknown's first try on an abstract socket).
// The id goes through encoding/json, so no id can close the string and add
// a key.
func encodeRequest(d Dialect, containerID string) []byte {
	arg := []byte("null")
	if d == DialectContainerID {
		arg, _ = json.Marshal(containerID) // a string never fails
	}
	b := make([]byte, 0, len(requestPrefix)+len(arg)+1)
	b = append(b, requestPrefix...)
	b = append(b, arg...)
	return append(b, '}')
}

// validID reports whether id is one runsc accepts (validateID:
// ^[\w+\.-]+$, \w being ASCII), at most MaxIDBytes, and not "." or "..".
func validID(id string) error {
	if id == "" || len(id) > MaxIDBytes || id == "." || id == ".." {
		return fmt.Errorf("%d bytes", len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '+' || c == '.' || c == '-') {
			return fmt.Errorf("byte %d is %q", i, c)
		}
	}
	return nil
}
