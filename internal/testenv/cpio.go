package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// initramfs is the tree of a guest's initramfs: guest paths (absolute,
// clean) to what they hold. Parents are made as directories when written.
type initramfs struct {
	entries map[string]initramfsEntry
}

type initramfsEntry struct {
	mode    uint32 // permission bits
	hostSrc string // a regular file copied from the host
	data    []byte // a regular file's content, when hostSrc is ""
	symlink string // a symbolic link's target
	dir     bool
}

func newInitramfs() *initramfs { return &initramfs{entries: map[string]initramfsEntry{}} }

// copyFile puts the host file src at the guest path dst with mode.
func (f *initramfs) copyFile(dst, src string, mode uint32) {
	f.entries[path.Clean(dst)] = initramfsEntry{mode: mode, hostSrc: src}
}

// writeFile puts data at the guest path dst with mode.
func (f *initramfs) writeFile(dst string, data []byte, mode uint32) {
	f.entries[path.Clean(dst)] = initramfsEntry{mode: mode, data: data}
}

// symlink puts a symbolic link to target at the guest path dst.
func (f *initramfs) symlink(dst, target string) {
	f.entries[path.Clean(dst)] = initramfsEntry{mode: 0o777, symlink: target}
}

// mkdir puts a directory at the guest path dst.
func (f *initramfs) mkdir(dst string) {
	f.entries[path.Clean(dst)] = initramfsEntry{mode: 0o755, dir: true}
}

// write writes the tree as an uncompressed cpio archive in the "newc"
// format the kernel unpacks (Documentation/driver-api/early-userspace/
// buffer-format.rst), directories before what they hold.
func (f *initramfs) write(w io.Writer) error {
	all := map[string]initramfsEntry{}
	for p, e := range f.entries {
		all[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := f.entries[d]; !ok {
				all[d] = initramfsEntry{mode: 0o755, dir: true}
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		names = append(names, p)
	}
	// Sorting by path puts every directory before its contents.
	sort.Strings(names)
	bw := bufio.NewWriterSize(w, 1<<20)
	ino := 1
	for _, p := range names {
		e := all[p]
		var (
			mode uint32
			size int64
			body io.Reader
		)
		switch {
		case e.dir:
			mode = 0o040000 | e.mode
		case e.symlink != "":
			mode, size, body = 0o120000|e.mode, int64(len(e.symlink)), strings.NewReader(e.symlink)
		case e.hostSrc != "":
			if err := copyCpioFile(bw, ino, strings.TrimPrefix(p, "/"), 0o100000|e.mode, e.hostSrc); err != nil {
				return fmt.Errorf("initramfs %s: %w", p, err)
			}
			ino++
			continue
		default:
			mode, size, body = 0o100000|e.mode, int64(len(e.data)), strings.NewReader(string(e.data))
		}
		if err := writeCpioEntry(bw, ino, strings.TrimPrefix(p, "/"), mode, size, body); err != nil {
			return fmt.Errorf("initramfs %s: %w", p, err)
		}
		ino++
	}
	if err := writeCpioEntry(bw, ino, "TRAILER!!!", 0, 0, nil); err != nil {
		return err
	}
	return bw.Flush()
}

// writeTo writes the archive to the file dst.
func (f *initramfs) writeTo(dst string) error {
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if err := f.write(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyCpioFile writes the host file src as one entry.
func copyCpioFile(w *bufio.Writer, ino int, name string, mode uint32, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return writeCpioEntry(w, ino, name, mode, st.Size(), f)
}

func writeCpioEntry(w *bufio.Writer, ino int, name string, mode uint32, size int64, body io.Reader) error {
	if size > 0xFFFFFFFF {
		return fmt.Errorf("%d bytes: over the newc format's 4 GiB", size)
	}
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	if _, err := w.WriteString(hdr + name + "\x00"); err != nil {
		return err
	}
	if err := pad4(w, len(hdr)+len(name)+1); err != nil {
		return err
	}
	if body != nil {
		n, err := io.Copy(w, body)
		if err != nil {
			return err
		}
		if n != size {
			return fmt.Errorf("copied %d bytes, want %d (the file changed)", n, size)
		}
	}
	return pad4(w, int(size%4))
}

func pad4(w *bufio.Writer, n int) error {
	if r := n % 4; r != 0 {
		_, err := w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
