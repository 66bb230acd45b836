package main

import (
	"fmt"
	"strings"

	"github.com/sandboxstats/sandboxstats/internal/rate"
)

// watchContainerFormat is a container line under a watch row: its name,
// its id (cut to shortID, as crictl shows ids), CPU cores over the row's
// interval, memory and working set in MiB, pids, and a note (exited, or
// why it has no rate).
const watchContainerFormat = "  %-20s  %-12s  %10s  %10s  %10s  %6s  %s"

// shortID is how many bytes of a container id a watch line shows (the
// JSON output has it whole).
const shortID = 12

// writeContainers prints r's containers under its row, a header first,
// and the sandbox's own share on a line of its own (nothing when r has
// neither).
func (t *tableWriter) writeContainers(r rate.Row) error {
	if len(r.Containers) == 0 && r.SandboxOwnCPUUsec == nil {
		return nil
	}
	if err := t.containerLine("CONTAINER", "ID", "CPU(cores)", "MEM(MiB)", "WSET(MiB)", "PIDS", "NOTE"); err != nil {
		return err
	}
	for _, c := range r.Containers {
		id := c.ID
		if len(id) > shortID {
			id = id[:shortID]
		}
		var notes []string
		if c.Exited {
			notes = append(notes, "exited")
		}
		if c.Event != rate.EventNone {
			notes = append(notes, string(c.Event))
		}
		pids := "-"
		if c.PidsCurrent != nil {
			pids = fmt.Sprint(*c.PidsCurrent)
		}
		if err := t.containerLine(safe(dash(c.Name)), safe(id), fmtFloat(c.CPUCores, 3), fmtMiB(c.MemoryCurrentBytes),
			fmtMiB(c.MemoryWorkingSetBytes), pids, strings.Join(notes, ", ")); err != nil {
			return err
		}
	}
	if r.SandboxOwnCPUUsec != nil {
		return t.containerLine("(sandbox own)", "", fmtFloat(r.SandboxOwnCPUCores, 3), "", "", "", "sentry, gofers, pause container")
	}
	return nil
}

func (t *tableWriter) containerLine(cols ...any) error {
	_, err := fmt.Fprintln(t.w, strings.TrimRight(fmt.Sprintf(watchContainerFormat, cols...), " "))
	return err
}
