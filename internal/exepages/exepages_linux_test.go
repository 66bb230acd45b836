package exepages_test

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/sandboxstats/sandboxstats/internal/exepages"
)

// exeRss is the Rss, in KiB, of the test binary's read-only mappings, from
// /proc/self/smaps.
func exeRss(t testing.TB) int {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kib int
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) >= 6 && strings.Contains(fs[0], "-") && !strings.HasSuffix(fs[0], ":"):
			in = fs[5] == exe && !strings.Contains(fs[1], "w")
		case in && len(fs) == 3 && fs[0] == "Rss:":
			n, err := strconv.Atoi(fs[1])
			if err != nil {
				t.Fatal(err)
			}
			kib += n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return kib
}

// work touches code and read-only data across the binary (unicode's and
// crc32's tables, strconv, sort, reflection's type data, a regexp) and
// returns what it computed.
func work() string {
	var b strings.Builder
	for r := rune(0); r < 0x30000; r += 97 {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			b.WriteRune(unicode.ToUpper(r))
		}
	}
	words := strings.Fields("release the read only pages of the binary and run on")
	sort.Strings(words)
	re := regexp.MustCompile(`^r[a-z]+$`)
	var matched []string
	for _, w := range words {
		if re.MatchString(w) {
			matched = append(matched, w)
		}
	}
	return fmt.Sprintf("%08x %v %v %s", crc32.ChecksumIEEE([]byte(b.String())), matched, reflect.TypeOf(slog.Logger{}).NumField(), strconv.Quote("\x00é"))
}

// TestReleaseSelf releases the test binary's own read-only pages: they
// leave its Rss, and the process runs on (its code and read-only data
// fault back in: the same work computes the same result after).
func TestReleaseSelf(t *testing.T) {
	want := work()
	before := exeRss(t)
	n, err := exepages.Release(exepages.DefaultProcRoot)
	if err != nil {
		t.Fatal(err)
	}
	after := exeRss(t)
	t.Logf("advised %d KiB; the executable's read-only Rss %d KiB before, %d KiB after", n>>10, before, after)
	if n == 0 {
		t.Fatal("Release advised nothing: the test binary's mappings were not found")
	}
	if after >= before {
		t.Errorf("read-only Rss of the executable %d KiB after Release, %d KiB before: want less", after, before)
	}
	if got := work(); got != want {
		t.Errorf("after Release the work computed %q, before %q", got, want)
	}
}

// TestReleaseAllocations holds what a release leaves on the heap: its
// buffer and a few small values, however long smaps is. An idle daemon
// that has never collected keeps every byte it allocated (e2e
// TestIntegrationStatsdMemory); reading the whole file and splitting its
// lines into strings left about 0.35 MiB resident in an idle statsd.
func TestReleaseAllocations(t *testing.T) {
	if _, err := exepages.Release(exepages.DefaultProcRoot); err != nil {
		t.Fatal(err)
	}
	const bound = 8 << 10
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := exepages.Release(exepages.DefaultProcRoot); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("Release allocated %d bytes in %d objects", allocated, after.Mallocs-before.Mallocs)
	if allocated > bound {
		t.Errorf("Release allocated %d bytes, want at most %d", allocated, bound)
	}
}

func TestReleaseNoProc(t *testing.T) {
	if _, err := exepages.Release(t.TempDir()); err == nil {
		t.Error("Release with a root without self/exe: want an error")
	}
}

func TestReleaseAfter(t *testing.T) {
	var buf strings.Builder
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Run("released after the delay", func(t *testing.T) {
		buf.Reset()
		exepages.ReleaseAfter(t.Context(), exepages.DefaultProcRoot, time.Millisecond, logger)
		if !strings.Contains(buf.String(), "released the binary's read-only pages") {
			t.Errorf("log %q: want the release", buf.String())
		}
	})
	t.Run("context ended first", func(t *testing.T) {
		buf.Reset()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		exepages.ReleaseAfter(ctx, exepages.DefaultProcRoot, time.Hour, logger)
		if buf.Len() != 0 {
			t.Errorf("log %q: want nothing", buf.String())
		}
	})
	t.Run("failure logged", func(t *testing.T) {
		buf.Reset()
		exepages.ReleaseAfter(t.Context(), t.TempDir(), time.Millisecond, logger)
		if !strings.Contains(buf.String(), "level=WARN") {
			t.Errorf("log %q: want a warning", buf.String())
		}
	})
}
