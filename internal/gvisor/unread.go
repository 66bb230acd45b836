// This file is what the breakdown does when a sandbox's state file does not
// read (runsc rewriting it, a disk error): the container is unread, not
// gone (identity keeps it live), its part of the split goes on, and the
// pause container's part stays in the own share, which never goes down.

package gvisor

import (
	"github.com/sandboxstats/sandboxstats/internal/foreign"
	"github.com/sandboxstats/sandboxstats/internal/source"
)

// maxUnreadReason cuts the reason of an unread container.
const maxUnreadReason = 512

// unreadState is a state file of the sandbox that is there but did not
// read or parse.
type unreadState struct {
	ID  string // the container id from the file's name
	Err error
}

// addUnread puts the unread containers of cr into r (the pause container
// apart) and their sentry figures into raw, and returns the pause
// container's id: the one remembered, or the root container's when its
// file is unread before any was seen. A pause container remembered but
// not listed is kept in raw too, so that its part of the split stays in
// the own share.
func (b *breakdown) addUnread(r *source.Reading, cr containerRead, raw map[string]uint64) string {
	b.mu.Lock()
	pause := b.pause
	b.mu.Unlock()
	for _, u := range cr.sb.Unread {
		raw[u.ID] = cr.usage.CPU[u.ID]
		if pause == "" && u.ID == cr.sb.ID {
			pause = u.ID
		}
		if u.ID == pause {
			continue
		}
		r.UnreadContainers = append(r.UnreadContainers, source.ContainerError{
			ID:     foreign.ASCII(u.ID, maxContainerText),
			Reason: foreign.Bound("runsc state file: "+u.Err.Error(), maxUnreadReason),
		})
	}
	if _, ok := raw[pause]; pause != "" && !ok {
		raw[pause] = cr.usage.CPU[pause]
	}
	return pause
}

// ownFloor remembers pause as the pause container's id and returns own,
// never below the last own share served.
func (b *breakdown) ownFloor(pause string, own uint64) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if pause != "" {
		b.pause = pause
	}
	b.ownShare = max(b.ownShare, own)
	return b.ownShare
}

// dropRestored forgets a restored state found to be another sandbox's (the
// splitter resets itself on another sandbox id).
func (b *breakdown) dropRestored() {
	b.own.reset()
	b.mu.Lock()
	b.pause, b.ownShare = "", 0
	b.mu.Unlock()
}
