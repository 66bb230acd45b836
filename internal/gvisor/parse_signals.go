package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/source"
)

// The parsers of the signal files (limits, OOM events, CFS bandwidth,
// pressure stall information). Like those in parse.go they take the bytes
// of one kernel file, know nothing of paths and name the token in their
// errors.

// parseLimit parses a limit file in which the kernel writes "max" for no
// limit: v2 memory.max and memory.high, pids.max (v1 and v2).
func parseLimit(b []byte) (source.Limit, error) {
	s, err := oneToken(b, "one value")
	if err != nil {
		return source.Limit{}, err
	}
	if string(s) == "max" {
		return source.Limit{Unlimited: true}, nil
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	if err != nil {
		return source.Limit{}, fmt.Errorf("token %q: want a number or \"max\": %w", s, err)
	}
	return source.Limit{Value: v}, nil
}

// v1Unlimited is the smallest v1 memory.limit_in_bytes that means no limit:
// PAGE_COUNTER_MAX (LONG_MAX pages' worth of bytes, capped) rounded down to
// the page size, 9223372036854771712 on 4 KiB pages.
func v1Unlimited(pageSize uint64) uint64 {
	if pageSize == 0 {
		pageSize = 4096
	}
	return math.MaxInt64 / pageSize * pageSize
}

// parseV1MemLimit parses v1 memory.limit_in_bytes: a number, unlimited at or
// above v1Unlimited(pageSize). v1 never writes "max" there.
func parseV1MemLimit(b []byte, pageSize uint64) (source.Limit, error) {
	v, err := parseSingleUint(b)
	if err != nil {
		return source.Limit{}, err
	}
	if v >= v1Unlimited(pageSize) {
		return source.Limit{Unlimited: true}, nil
	}
	return source.Limit{Value: v}, nil
}

// parseCFSQuota parses v1 cpu.cfs_quota_us: microseconds per period, -1 for
// no quota. Any other negative value or "max" is malformed.
func parseCFSQuota(b []byte) (source.Limit, error) {
	s, err := oneToken(b, "one value")
	if err != nil {
		return source.Limit{}, err
	}
	if string(s) == "-1" {
		return source.Limit{Unlimited: true}, nil
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	if err != nil {
		return source.Limit{}, fmt.Errorf("token %q: want microseconds or -1: %w", s, err)
	}
	return source.Limit{Value: v}, nil
}

// parseCPUMax parses v2 cpu.max: "<quota> <period>" in microseconds, the
// quota "max" for none.
func parseCPUMax(b []byte) (quota source.Limit, period uint64, err error) {
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return source.Limit{}, 0, fmt.Errorf("%q: want \"<quota> <period>\", got %d fields", bytes.TrimSpace(b), len(f))
	}
	if quota, err = parseLimit([]byte(f[0])); err != nil {
		return source.Limit{}, 0, fmt.Errorf("quota: %w", err)
	}
	if period, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return source.Limit{}, 0, fmt.Errorf("period token %q: %w", f[1], err)
	}
	return quota, period, nil
}

// parseKeyedMap parses a whole flat keyed file ("key value" per line:
// memory.events, memory.oom_control, cpu.stat). A malformed line anywhere
// makes the file malformed; the first occurrence of a key wins.
func parseKeyedMap(b []byte) (map[string]uint64, error) {
	m := map[string]uint64{}
	err := eachKeyed(b, func(k []byte, v uint64) {
		if _, seen := m[string(k)]; !seen {
			m[string(k)] = v
		}
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// pressureTotals are the total= fields of a PSI file, in microseconds. Full
// is nil when the kernel writes no "full" line (cpu.pressure before Linux
// 5.13).
type pressureTotals struct {
	Some, Full *uint64
}

// parsePressure parses a PSI file (cpu.pressure, memory.pressure,
// io.pressure): a "some" line and an optional "full" line, each
// "avg10=<pct> avg60=<pct> avg300=<pct> total=<usec>".
func parsePressure(b []byte) (pressureTotals, error) {
	var p pressureTotals
	for n, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		total, err := parsePressureLine(f[1:])
		if err != nil {
			return pressureTotals{}, fmt.Errorf("line %d %q: %w", n+1, line, err)
		}
		var dst **uint64
		switch f[0] {
		case "some":
			dst = &p.Some
		case "full":
			dst = &p.Full
		default:
			return pressureTotals{}, fmt.Errorf("line %d %q: token %q: want \"some\" or \"full\"", n+1, line, f[0])
		}
		if *dst != nil {
			return pressureTotals{}, fmt.Errorf("line %d %q: a second %q line", n+1, line, f[0])
		}
		*dst = &total
	}
	if p.Some == nil {
		return pressureTotals{}, errors.New("no \"some\" line")
	}
	return p, nil
}

// parsePressureLine parses the key=value fields after "some"/"full" and
// returns total=. The averages must be non-negative decimals; other keys are
// tolerated as key=value for kernels that add one.
func parsePressureLine(fields []string) (uint64, error) {
	var total uint64
	seen := false
	for _, tok := range fields {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || k == "" || v == "" {
			return 0, fmt.Errorf("token %q: want key=value", tok)
		}
		switch k {
		case "total":
			t, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("token %q: %w", tok, err)
			}
			if seen {
				return 0, fmt.Errorf("token %q: a second total", tok)
			}
			total, seen = t, true
		case "avg10", "avg60", "avg300":
			if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
				return 0, fmt.Errorf("token %q: not a percentage", tok)
			}
		}
	}
	if !seen {
		return 0, errors.New("no total=")
	}
	return total, nil
}
